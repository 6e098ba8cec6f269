"""A data-parallel MLP classifier on the digits dataset that ships with scikit-learn.

The training step is a JAX function bound to one island's slice with pw.pmap, written as for
jax.pmap: the parameters are broadcast to every device (in_axes=None) and come back as one value
(out_axes=None), each device takes its share of the batch, and the gradients are averaged across
the slice inside the compiled function (jax.lax.pmean over the "batch" axis). The parameters stay
on the devices between steps (each step's results are handles passed to the next). At the end, the same steps run as plain JAX
on one device on the whole batch, and the parameters must match within 1e-5 relative.

    .venv/bin/python examples/mlp_dp.py [--steps 40] [--devices 4] [--batch 128]

The cluster is the one at PW_CLUSTER (e.g. `pw up --islands 2 --hosts-per-island 2
--devices-per-host 2`, where the 4-device slice spans both worker processes of an island and the
all-reduce runs through the runtime's collectives), else an embedded one (PW_ISLANDS x
PW_HOSTS_PER_ISLAND x PW_DEVICES_PER_HOST).
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits

import pathways as pw

LEARNING_RATE = 0.5
TOLERANCE = 1e-5


def init_params(seed, sizes):
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out)).astype(np.float32)
        params.append({"w": w, "b": np.zeros((fan_out,), np.float32)})
    return params


def logits_fn(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(logits_fn(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def sgd(params, grads):
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def dp_train_step(params, x, y):
    """One device's part of a data-parallel step (x, y: its share of the batch)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = jax.lax.pmean(grads, "batch")  # The all-reduce, inside the compiled function.
    return sgd(params, grads), jax.lax.pmean(loss, "batch")


@jax.jit
def reference_step(params, x, y):
    """The same step on one device and the whole batch."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return sgd(params, grads), loss


def relative_difference(ours, theirs) -> float:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


def load_data(seed):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_train = 1500
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--devices", type=int, default=4, help="devices in the slice")
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = args.devices
    if args.batch % n:
        parser.error(f"--batch {args.batch} is not divisible by --devices {n}")
    per_device = args.batch // n

    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    params0 = init_params(args.seed, [64, args.hidden, 10])

    devices = pw.make_virtual_device_set().add_slice(devices=n)
    step_fn = pw.pmap(dp_train_step, devices=devices, axis_name="batch", in_axes=(None, 0, 0),
                      out_axes=None)
    predict = pw.pmap(lambda p, x: jnp.argmax(logits_fn(p, x), axis=-1), devices=devices,
                      in_axes=(None, 0))

    @pw.program
    def train_step(params, x, y):
        return step_fn(params, x, y)

    @pw.program
    def evaluate(params, x):
        return predict(params, x)

    def batch(step):
        start = (step * args.batch) % (len(x_train) - args.batch + 1)
        return x_train[start:start + args.batch], y_train[start:start + args.batch]

    print(f"training a {64}-{args.hidden}-10 MLP on digits ({len(x_train)} train, "
          f"{len(x_test)} test) data-parallel over {n} devices {devices}, batch {args.batch}",
          flush=True)
    params = params0  # numpy first; Arrays on the devices after step 1.
    losses = []
    for step in range(args.steps):
        xb, yb = batch(step)
        t0 = time.perf_counter()
        params, loss = train_step(params, xb.reshape(n, per_device, 64),
                                  yb.reshape(n, per_device))
        loss_value = float(loss)  # Waits for the step.
        dt = time.perf_counter() - t0
        losses.append(loss_value)
        print(f"step {step + 1:4d}  loss {loss_value:.4f}  examples/s {args.batch / dt:10.0f}",
              flush=True)

    # Held-out accuracy, computed on the slice (test rows padded to a multiple of n).
    pad = (-len(x_test)) % n
    xt = np.concatenate([x_test, np.zeros((pad, 64), np.float32)]).reshape(n, -1, 64)
    predicted = np.asarray(evaluate(params, xt)).reshape(-1)[:len(x_test)]
    accuracy = float(np.mean(predicted == y_test))
    print(f"held-out accuracy {accuracy:.4f} ({len(x_test)} examples)", flush=True)

    # The same training on one device, whole batches.
    ref = params0
    for step in range(args.steps):
        xb, yb = batch(step)
        ref, _ = reference_step(ref, xb, yb)
    worst = 0.0
    for ours, theirs in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
        worst = max(worst, relative_difference(ours, theirs))
    ok = worst <= TOLERANCE and losses[-1] < losses[0]
    print(f"parameters vs single-device training after {args.steps} steps: max relative "
          f"difference {worst:.2e} (tolerance {TOLERANCE:.0e}); loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}: {'OK' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
