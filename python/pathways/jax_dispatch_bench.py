"""JAX's own dispatch in one process, the baseline `pw bench dispatch --jax` sets beside OpByOp.

`x = step(x)` in a Python loop, step = jax.pmap(lambda x: lax.pmax(x, "i") + 1) over --devices
CPU devices of this one process: the bench's own step (an all-reduce-max and an add on one
scalar per device), each call from the previous output, in batches of --chain calls blocked at
the end of each batch. (OpByOp keeps two chains of 128 in flight; with more than a few dozen
calls in flight this JAX's XLA:CPU all-reduce deadlocks in its rendezvous on a 2-core machine,
so the batch is at most 32.)

Prints one JSON object to stdout: {"computations_per_second": best round, "round_rates": [...],
"devices": n, "chain": c}; progress to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--chain", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=0.5, help="per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    a.chain = max(1, min(a.chain, 32))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    # (Not XLA_FLAGS' --xla_force_host_platform_device_count: with it this JAX's all-reduce
    # deadlocks in its rendezvous on a 2-core machine.)
    jax.config.update("jax_num_cpu_devices", a.devices)
    step = jax.pmap(lambda x: jax.lax.pmax(x, "i") + 1, axis_name="i")
    x0 = step(jnp.zeros((a.devices,), jnp.float32))
    x0.block_until_ready()
    rates = []
    for _ in range(a.rounds):
        x, calls = x0, 0
        start = time.perf_counter()
        while True:
            for _ in range(a.chain):
                x = step(x)
            calls += a.chain
            x.block_until_ready()
            if time.perf_counter() - start >= a.seconds:
                break
        x.block_until_ready()
        rates.append(calls / (time.perf_counter() - start))
        print(f"jax dispatch: {rates[-1]:.0f} computations/s", file=sys.stderr, flush=True)
    print(json.dumps({"computations_per_second": max(rates), "round_rates": rates,
                      "devices": a.devices, "chain": a.chain}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
