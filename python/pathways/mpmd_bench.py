"""pw bench mpmd: a 3-stage MPMD pipeline, on an embedded cluster, on a process cluster, and in JAX.

The program: three stages, each an SPMD function over its own 2-device slice (a psum over the
slice and a few elementwise ops on a (2, --elements) float32 array, KiB-sized shards), slice 1
and 3 on island 0 and slice 2 on island 1, so each call moves its array across DCN twice:

    @pw.program
    def pipeline(x):
        return stage3(stage2(stage1(x)))

Contenders, measured in interleaved rounds in this one process (each reports its best round):

- embedded: an embedded cluster of --islands x --hosts-per-island x --devices-per-host (default
            2 x 2 x 2, `pw up`'s shape) in this process;
- cluster:  the same program on a process cluster: --cluster ADDRESS (or $PW_CLUSTER), else
            one this bench starts with `pw up` of the same shape in a state directory of its
            own (and stops);
            --no-cluster skips it;
- jax:      JAX running the same three stages MPMD in this process: `jit` of `shard_map` on
            three 2-device meshes of 8 CPU devices, `jax.device_put` between stages.

Each in two modes: sync (wait for each call's result before the next call) and async (--batch
calls in flight on the same input, waited for at the end of each batch).

Prints one JSON object to stdout: {"results": [{"side", "mode", "calls_per_second",
"round_rates"}, ...], "summary": {"cluster_over_embedded", "embedded_over_jax",
"cluster_async_over_sync", "embedded_async_over_sync", ...}}; progress to stderr. Every side's
result is checked against numpy's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from .xla_overhead_bench import _rate

DEVICES_PER_STAGE = 2


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _stage(i):
    """Stage i's SPMD body over one device's shard (named axis "s")."""
    import jax
    import jax.numpy as jnp

    def body(x):
        total = jax.lax.psum(x, "s")
        return jnp.tanh(x * (0.5 + 0.1 * i) + total * 0.25)

    return body


def _reference(x, stages=3):
    for i in range(stages):
        total = x.sum(axis=0, keepdims=True)
        x = np.tanh(x * (0.5 + 0.1 * i) + total * 0.25)
    return x


def _modes(call, x, batch):
    """(sync, async) batch runners of `call` (x -> an array with block_until_ready)."""
    def sync():
        for _ in range(batch):
            call(x).block_until_ready()

    def async_():
        ys = [call(x) for _ in range(batch)]
        for y in ys:
            y.block_until_ready()

    return sync, async_


def _pathways_side(conn, x0, batch):
    """The pipeline bound on `conn`'s cluster: (sync, async, result of one call)."""
    import pathways as pw

    ds = pw.VirtualDeviceSet(conn)
    s1 = ds.add_slice(devices=DEVICES_PER_STAGE, island=0)
    s2 = ds.add_slice(devices=DEVICES_PER_STAGE, island=1)
    s3 = ds.add_slice(devices=DEVICES_PER_STAGE, island=0)
    f1, f2, f3 = (pw.pmap(_stage(i), devices=s, axis_name="s") for i, s in enumerate((s1, s2, s3)))

    @pw.program
    def pipeline(x):
        return f3(f2(f1(x)))

    x = pw.device_put(x0, s1)
    sync, async_ = _modes(pipeline, x, batch)
    return sync, async_, np.asarray(pipeline(x)), (s1, s2, s3)


def _jax_side(x0, batch):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    try:
        from jax import shard_map
    except ImportError:  # Older JAX.
        from jax.experimental.shard_map import shard_map
    devices = jax.devices("cpu")
    if len(devices) < 3 * DEVICES_PER_STAGE:
        raise SystemExit(f"JAX has {len(devices)} CPU devices; the JAX side needs "
                         f"{3 * DEVICES_PER_STAGE}")
    meshes = [Mesh(np.array(devices[i * DEVICES_PER_STAGE:(i + 1) * DEVICES_PER_STAGE]), ("s",))
              for i in range(3)]
    shardings = [NamedSharding(m, P("s")) for m in meshes]
    stages = [jax.jit(shard_map(_stage(i), mesh=m, in_specs=P("s"), out_specs=P("s")))
              for i, m in enumerate(meshes)]

    def pipeline(x):
        for i, stage in enumerate(stages):
            x = stage(jax.device_put(x, shardings[i]) if i else x)
        return x

    x = jax.device_put(x0, shardings[0])
    sync, async_ = _modes(pipeline, x, batch)
    return sync, async_, np.asarray(pipeline(x))


@contextlib.contextmanager
def _local_cluster(args):
    """A `pw up` cluster of the bench's shape in a state directory of its own, stopped after."""
    state = tempfile.mkdtemp(prefix="pw-bench-mpmd-")
    env = dict(os.environ, PW_STATE_DIR=state)
    built = os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "pw")
    pw_bin = args.pw or (built if os.path.exists(built) else shutil.which("pw"))
    if not pw_bin:
        raise SystemExit("mpmd bench: no pw binary to start a cluster with (--pw, or make build)")
    try:
        out = subprocess.run(
            [pw_bin, "up", "--detach", "--islands", str(args.islands), "--hosts-per-island",
             str(args.hosts_per_island), "--devices-per-host", str(args.devices_per_host)],
            env=env, check=True, capture_output=True, text=True, timeout=300)
        address = out.stdout.strip().splitlines()[-1]
        _log(f"started a local cluster at {address} (state in {state})")
        try:
            yield address, env.get("PW_TOKEN", "")
        finally:
            subprocess.run([pw_bin, "down"], env=env, capture_output=True, timeout=120)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pw bench mpmd", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object to stdout")
    ap.add_argument("--cluster", default=None,
                    help="a running cluster (default: $PW_CLUSTER, else one it starts)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the process cluster")
    ap.add_argument("--no-jax", action="store_true", help="skip JAX's side")
    ap.add_argument("--islands", type=int, default=2)
    ap.add_argument("--hosts-per-island", type=int, default=2)
    ap.add_argument("--devices-per-host", type=int, default=2)
    ap.add_argument("--elements", type=int, default=256, help="float32 elements per shard")
    ap.add_argument("--batch", type=int, default=32, help="calls per batch (in flight, async)")
    ap.add_argument("--min-seconds", type=float, default=3.0,
                    help="seconds of measurement per contender")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pw", default=None, help="the pw binary (for `pw up`)")
    args = ap.parse_args(argv)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    # Before JAX makes its CPU backend. (Not XLA_FLAGS' --xla_force_host_platform_device_count:
    # with it this JAX's collectives deadlock in their rendezvous on a 2-core machine.)
    jax.config.update("jax_num_cpu_devices", 8)
    import pathways as pw
    from pathways import _pathways

    x0 = np.linspace(-1, 1, DEVICES_PER_STAGE * args.elements,
                     dtype=np.float32).reshape(DEVICES_PER_STAGE, args.elements)
    expected = _reference(x0)
    with contextlib.ExitStack() as stack:
        sides = {}
        cluster = _pathways.EmbeddedCluster.create(args.islands, args.hosts_per_island,
                                                   args.devices_per_host)
        sides["embedded"] = pw._connection(cluster, _pathways.Client.connect(cluster, "mpmd-bench"))
        address = None
        if not args.no_cluster:
            if args.cluster or os.environ.get("PW_CLUSTER"):
                address = _pathways.cluster_address(args.cluster or "")
                token = os.environ.get("PW_TOKEN", "")
            else:
                address, token = stack.enter_context(_local_cluster(args))
            remote = _pathways.RemoteCluster.dial(address, token)
            sides["cluster"] = pw._connection(
                remote, _pathways.Client.connect_remote(remote, "mpmd-bench"))

        contenders, checks, placement = [], {}, {}
        for side, conn in sides.items():
            sync, async_, y, slices = _pathways_side(conn, x0, args.batch)
            checks[side] = y
            placement[side] = [{"devices": s.devices, "hosts": s.hosts, "islands": s.islands}
                               for s in slices]
            contenders += [(side, "sync", sync), (side, "async", async_)]
        if not args.no_jax:
            sync, async_, y = _jax_side(x0, args.batch)
            checks["jax"] = y
            contenders += [("jax", "sync", sync), ("jax", "async", async_)]
        for side, y in checks.items():
            if not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"mpmd bench: {side} computed {y}, numpy {expected}")

        for _, _, run in contenders:
            run()  # Warm-up.
        rates = {(side, mode): [] for side, mode, _ in contenders}
        for r in range(args.rounds):
            for side, mode, run in contenders:
                rates[(side, mode)].append(_rate(run, args.batch, args.min_seconds / args.rounds))
                _log(f"round {r}: {side:9s} {mode:5s} {rates[(side, mode)][-1]:9.1f} calls/s")
        del contenders  # Arrays and programs go before their clusters.

    best = {k: max(v) for k, v in rates.items()}
    results = [{"side": side, "mode": mode, "calls_per_second": round(best[(side, mode)], 1),
                "round_rates": [round(x, 1) for x in rates[(side, mode)]]}
               for side, mode in rates]

    def ratio(a, b):
        return round(best[a] / best[b], 3) if a in best and b in best else None

    def paired(a, b):
        if a not in rates or b not in rates:
            return None
        return round(statistics.median(x / y for x, y in zip(rates[a], rates[b])), 3)

    summary = {}
    for mode in ("sync", "async"):
        summary[f"cluster_over_embedded_{mode}"] = ratio(("cluster", mode), ("embedded", mode))
        summary[f"embedded_over_jax_{mode}"] = ratio(("embedded", mode), ("jax", mode))
        summary[f"cluster_over_embedded_{mode}_paired_median"] = paired(("cluster", mode),
                                                                        ("embedded", mode))
        summary[f"embedded_over_jax_{mode}_paired_median"] = paired(("embedded", mode),
                                                                    ("jax", mode))
    for side in ("embedded", "cluster", "jax"):
        summary[f"{side}_async_over_sync"] = ratio((side, "async"), (side, "sync"))
    summary = {k: v for k, v in summary.items() if v is not None}
    out = {"benchmark": "mpmd", "shape": [args.islands, args.hosts_per_island,
                                          args.devices_per_host],
           "cluster": address, "stages": 3, "devices_per_stage": DEVICES_PER_STAGE,
           "shard_bytes": args.elements * 4, "batch": args.batch, "rounds": args.rounds,
           "statistic": "best round of each contender; *_paired_median: median over rounds of "
                        "the ratio in the same round",
           "placement": placement, "results": results, "summary": summary}
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"{r['side']:9s} {r['mode']:5s} {r['calls_per_second']:10.1f} calls/s")
        for k, v in summary.items():
            print(f"{k:40s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
