"""Recovery from a lost host: the LM of model.py trains data-parallel, checkpoints, loses a host,
restores the last checkpoint onto the devices that remain and goes on, in the same process.

The trainer trains on a `--devices` slice of island 0 (pw.pmap, the gradients averaged with
jax.lax.pmean; the parameters a pytree replicated on the slice) and saves a checkpoint every
`--every` steps (pw.checkpoint: each worker writes its shards, asynchronously; a save commits
after the one before). After step `--kill-at` one host of the slice is lost: on a running cluster
(PW_CLUSTER, e.g. `pw up --islands 2 --hosts-per-island 2 --devices-per-host 2`) its worker
process is killed (SIGKILL; its pid from pw up's state); on an embedded cluster, which has no
processes to kill, its devices are removed. The next step fails naming the host. The trainer
then takes a `--devices-after` slice of the devices that remain (a smaller data-parallel width;
`pw up --restart-workers` brings the killed worker back for later slices), restores the last
committed checkpoint onto it and trains on from that checkpoint's step, the same global batch
per step. It reports the recovery time (from the kill to the next completed step) and checks its
last loss against plain JAX on one device, uninterrupted (relative difference within 1e-5).

    .venv/bin/python examples/lm/recover.py [--steps 12] [--every 4] [--kill-at 6] [--json]

Checkpoints go to `--dir`: on a running cluster within its checkpoint root (pw up's: <state
dir>/checkpoints; default lm-recover/<pid>, kept); on an embedded cluster any path (default a
temporary directory, removed at the end).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as lm  # noqa: E402
from train import LEARNING_RATE, one_device  # noqa: E402 (the one-device reference)

import pathways as pw  # noqa: E402

TOLERANCE = 1e-5


def data_parallel_step(c, devices):
    """One training step, data-parallel over `devices`: (params, tokens, targets) ->
    (params, loss), the batch split over the slice's devices."""
    def step(params, tokens, targets):
        value, grads = jax.value_and_grad(lambda p: lm.loss(c, p, tokens, targets))(params)
        grads, value = jax.lax.pmean((grads, value), "batch")
        return lm.sgd(params, grads, LEARNING_RATE), value
    fn = pw.pmap(step, devices=devices, axis_name="batch", in_axes=(None, 0, 0), out_axes=None)
    n = devices.num_devices

    def run(params, tokens, targets):
        shape = (n, tokens.shape[0] // n) + tokens.shape[1:]
        return fn(params, tokens.reshape(shape), targets.reshape(shape))
    return run


def lose_host(host: int) -> str:
    """Kills `host`'s worker process (a running cluster) or removes its devices (embedded)."""
    conn = pw._default_connection()
    if isinstance(conn.cluster, pw._pathways.EmbeddedCluster):
        for h in pw.status()["hosts"]:
            if h["host"] == host:
                for d in h["devices"]:
                    conn.cluster.remove_device(d["device"], f"host:{host} was lost (recover.py)")
        return f"removed the devices of host:{host}"
    state_dir = os.environ.get("PW_STATE_DIR") or os.path.expanduser("~/.local/state/pathways")
    with open(os.path.join(state_dir, "cluster.json")) as f:
        state = json.load(f)
    if state["address"] != os.environ.get("PW_CLUSTER", state["address"]):
        raise RuntimeError(f"PW_CLUSTER is not the cluster pw up started ({state['address']})")
    pid = state["worker_pids"][host]
    os.kill(pid, signal.SIGKILL)
    return f"killed host:{host}'s worker (pid {pid})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4, help="steps between checkpoints")
    parser.add_argument("--kill-at", type=int, default=6, help="the step after which a host goes")
    parser.add_argument("--devices", type=int, default=4, help="data-parallel width before")
    parser.add_argument("--devices-after", type=int, default=2, help="... and after the loss")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", help="where the checkpoints go (see above)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout at the end")
    args = parser.parse_args(argv)
    if not 1 <= args.every <= args.kill_at < args.steps:
        parser.error("need 1 <= --every <= --kill-at < --steps")
    if args.batch % args.devices or args.batch % args.devices_after:
        parser.error("--batch must divide by --devices and --devices-after")
    out = sys.stderr if args.json else sys.stdout
    log = lambda line: print(line, file=out, flush=True)

    c = lm.Config()
    stream = lm.batches(lm.load_corpus(), args.batch, c.seq, args.seed)
    data = [next(stream) for _ in range(args.steps)]
    vds = pw.make_virtual_device_set()
    embedded = isinstance(pw._default_connection().cluster, pw._pathways.EmbeddedCluster)
    if args.dir is None:
        args.dir = (tempfile.mkdtemp(prefix="lm-recover.") if embedded
                    else f"lm-recover/{os.getpid()}")
        if embedded:
            atexit.register(shutil.rmtree, args.dir, ignore_errors=True)
    devices = vds.add_slice(devices=args.devices, island=0)
    victim = devices.hosts[-1]
    log(f"training on devices {devices.devices} (hosts {sorted(set(devices.hosts))}); "
        f"checkpoints every {args.every} steps in {args.dir}; host:{victim} goes after step "
        f"{args.kill_at}")
    run = data_parallel_step(c, devices)
    params = lm.init_params(c, args.seed, 1)
    losses = [None] * args.steps
    saves = []  # (step, pw.checkpoint.Save)
    step, killed_at, recovered, error = 0, None, None, None
    while step < args.steps:
        t0 = time.perf_counter()
        try:
            params, loss = run(params, *data[step])
            losses[step] = float(loss)  # Waits: the error of a lost host surfaces here.
        except pw.errors.Error as e:
            if killed_at is None:
                raise
            error = str(e).splitlines()[0]
            log(f"  step {step + 1} failed: {error}")
            # The last checkpoint that committed (one being written when the host went may not).
            last = None
            for s, save in reversed(saves):
                try:
                    last = (s, save.wait())
                    break
                except pw.errors.Error as failed:
                    log(f"  the checkpoint of step {s} did not commit: "
                        f"{str(failed).splitlines()[0]}")
            if last is None:
                raise RuntimeError("no checkpoint committed before the host was lost") from e
            devices.release()
            devices = vds.add_slice(devices=args.devices_after)
            run = data_parallel_step(c, devices)
            params = pw.checkpoint.restore(last[1], like=params, devices=devices)
            log(f"  restored step {last[0]}'s checkpoint onto devices {devices.devices} "
                f"(hosts {sorted(set(devices.hosts))}); training on from step {last[0] + 1}")
            step = last[0]
            saves = [(s, v) for s, v in saves if s <= last[0]]
            continue
        if killed_at is not None and recovered is None:
            recovered = time.perf_counter() - killed_at
            log(f"  recovered: {recovered:.2f} s from the loss of host:{victim} to this step")
        step += 1
        took = time.perf_counter() - t0
        log(f"  step {step:3d}  loss {losses[step - 1]:.6f}  {took * 1e3:7.1f} ms  "
            f"{args.batch * c.seq / took:8.0f} tokens/s")
        if step % args.every == 0 and step < args.steps:
            saves.append((step, pw.checkpoint.save(params, f"{args.dir}/step_{step}")))
            log(f"  checkpoint of step {step}: the workers write it to {args.dir}/step_{step} "
                "while training goes on")
        if step == args.kill_at and killed_at is None:
            killed_at = time.perf_counter()
            log(f"  {lose_host(victim)}")
    for _, save in saves:
        save.wait()
    _, reference = one_device(c, args, data)
    diff = abs(losses[-1] - reference[-1]) / abs(reference[-1])
    ok = diff <= TOLERANCE and recovered is not None
    log(f"after {args.steps} steps: loss {losses[-1]:.6f}, one device uninterrupted "
        f"{reference[-1]:.6f} (relative difference {diff:.1e}): {'OK' if ok else 'MISMATCH'}")
    if args.json:
        print(json.dumps({"recovery_seconds": recovered, "error": error, "losses": losses,
                          "one_device_losses": reference, "loss_rel_diff_vs_one_device": diff,
                          "devices_after": devices.devices}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
