"""Training and serving at once on one cluster: a trainer updates an MLP's weights on one island
while a separate client serves predictions from the live weights on another.

The trainer (this process's client) trains the digits MLP of examples/mlp_dp.py data-parallel
on a slice of island 0, its parameters one flat array on the devices. It shares that array
(`Array.share()`, a token) and publishes every new version under the same token
(`params.share(token=t)`). The server is another client of the cluster, with its own slice on
the other island (`add_slice(avoid=trainer's slice)`): it imports the token's current array
(`pw.Array.from_shared(t)`) and predicts the held-out digits with it, without copying the
weights through any host. When training ends the trainer publishes its final weights; those
and the server's predictions with them are checked against the same training and prediction in
plain JAX on one device (within 1e-5 relative); then the trainer revokes the token, and the
server's next import fails.

    .venv/bin/python examples/train_and_serve.py [--steps 30]

On an embedded cluster the server is a second client in this process (a thread); with
PW_CLUSTER naming a running cluster (`pw up`) it is a second process, started here.
"""
import argparse
import os
import queue
import subprocess
import sys
import threading

import numpy as np
from jax.flatten_util import ravel_pytree

import pathways as pw
from mlp_dp import (TOLERANCE, dp_train_step, init_params, load_data, logits_fn, reference_step,
                    relative_difference)

HIDDEN = 64


def unravel_fn(seed):
    return ravel_pytree(init_params(seed, [64, HIDDEN, 10]))[1]


def serve(client, commands, report, seed):
    """The server: on each command, imports the shared weights and predicts the test set.

    commands: ("serve", token) | ("final", token) | ("stop", token); report(line) answers.
    """
    (_, _), (x_test, y_test) = load_data(seed)
    unravel = unravel_fn(seed)
    devices = client.make_virtual_device_set().add_slice(devices=2, island=1)
    pad = (-len(x_test)) % 2
    xt = np.concatenate([x_test, np.zeros((pad, 64), np.float32)]).reshape(2, -1, 64)
    predict = pw.pmap(lambda flat, x: logits_fn(unravel(flat), x), devices=devices,
                      in_axes=(None, 0))
    while True:
        what, token = commands()
        try:
            weights = pw.Array.from_shared(token, client=client)
        except pw.errors.NotFound as e:
            report(f"revoked: {e.message}")
            return
        logits = np.asarray(predict(weights, xt)).reshape(-1, 10)[:len(x_test)]
        accuracy = float(np.mean(logits.argmax(-1) == y_test))
        if what == "final":
            report(f"final {accuracy:.4f} {logits.tobytes().hex()}")
        else:
            report(f"served accuracy {accuracy:.4f} (weights on devices "
                   f"{sorted(d.id for d in weights.devices())}, predicting on {devices.devices})")


def server_main(seed):  # The server as its own process (`--serve`): commands on stdin.
    pw.connect()
    client = pw.Client("server")

    def commands():
        what, token = sys.stdin.readline().split()
        return what, token

    def report(line):
        print(line, flush=True)
    serve(client, commands, report, seed)


class _Server:
    """The server, in a thread (embedded cluster) or a process (a running cluster)."""

    def __init__(self, seed):
        if os.environ.get("PW_CLUSTER"):
            self._proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", "--seed", str(seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        else:
            self._proc = None
            self._commands, self._answers = queue.Queue(), queue.Queue()
            client = pw.Client("server")
            self._thread = threading.Thread(
                target=serve, args=(client, self._commands.get, self._answers.put, seed))
            self._thread.start()

    def ask(self, what, token):
        if self._proc is not None:
            self._proc.stdin.write(f"{what} {token}\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline().strip()
            if not line:
                raise RuntimeError(f"the server exited ({self._proc.wait()})")
            return line
        self._commands.put((what, token))
        return self._answers.get(timeout=300)

    def close(self):
        if self._proc is not None:
            self._proc.stdin.close()
            return self._proc.wait(timeout=120)
        self._thread.join(timeout=120)
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        server_main(args.seed)
        return 0

    (x_train, y_train), (x_test, _) = load_data(args.seed)
    flat0, unravel = ravel_pytree(init_params(args.seed, [64, HIDDEN, 10]))
    trainer = pw.make_virtual_device_set().add_slice(devices=2, island=0)

    def flat_step(flat, x, y):
        params, loss = dp_train_step(unravel(flat), x, y)
        return ravel_pytree(params)[0], loss

    step = pw.pmap(flat_step, devices=trainer, axis_name="batch", in_axes=(None, 0, 0),
                   out_axes=None)

    def batch(i):
        start = (i * args.batch) % (len(x_train) - args.batch + 1)
        return (x_train[start:start + args.batch].reshape(2, -1, 64),
                y_train[start:start + args.batch].reshape(2, -1))

    server = _Server(args.seed)
    flat, token = flat0, None  # The weights: one flat array, on the trainer's slice after step 1.
    print(f"trainer on devices {trainer.devices} (island {trainer.islands}); server on island 1",
          flush=True)
    for i in range(args.steps):
        flat, loss = step(flat, *batch(i))
        token = flat.share() if token is None else flat.share(token=token)  # Publish.
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i + 1:3d}  loss {float(loss):.4f}  {server.ask('serve', token)}",
                  flush=True)
    final = server.ask("final", token).split()
    served = np.frombuffer(bytes.fromhex(final[2]), np.float32).reshape(-1, 10)
    ref = init_params(args.seed, [64, HIDDEN, 10])  # The same training in plain JAX.
    for i in range(args.steps):
        xb, yb = batch(i)
        ref, _ = reference_step(ref, xb.reshape(-1, 64), yb.reshape(-1))
    diff = max(relative_difference(flat, ravel_pytree(ref)[0]),
               relative_difference(served, logits_fn(ref, x_test)))
    pw.revoke(token)
    revoked = server.ask("stop", token)
    code = server.close()
    ok = diff <= TOLERANCE and revoked.startswith("revoked") and code == 0
    print(f"final weights and the predictions served with them (accuracy {final[1]}) vs plain "
          f"JAX: max relative difference {diff:.2e} (tolerance {TOLERANCE:.0e}); after revocation the "
          f"server saw: {revoked.split(':')[0]}: {'OK' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
