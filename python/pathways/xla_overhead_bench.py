"""pw bench xla-overhead: our dispatch of an XLA computation vs JAX's own, same CPU, same run.

The same jitted function, f(x, w) = tanh(x @ w) / 2 on n x n float32 matrices, at sizes from about
10 µs to about 10 ms of compute, is run back to back (each output feeding the next call):

- jax:      a Python loop of `x = f(x, w)` with JAX's dispatch, blocked at the end of each batch.
            With --jax-backend same-plugin (the default) JAX drives the very PJRT plugin pathways
            loads (registered with jax as a plugin backend), so both run the same XLA build and
            the ratio measures dispatch alone; with builtin, jaxlib's own client (on CPU a
            different XLA version than the plugin). Both JAX rates are reported;
- pathways: `f` bound with pw.pmap to a one-device slice, `chain` calls of it traced into one
            program (parallel asynchronous dispatch in C++), the program run back to back with its
            result handle fed to the next run;
- pathways_opbyop_per_second: one pathways call per Python call (a one-node program each).

compute_us is the device time of one call: the fastest of several synchronous JAX calls on the
--jax-backend backend.

With --cluster ADDRESS (a running cluster, e.g. `pw up --islands 2 --hosts-per-island 2
--devices-per-host 2`) it measures instead the same chain of `chain` small SPMD XLA functions
(a psum over the slice, so the shards meet in the runtime's collectives) on a 2-device slice
spanning two worker processes and on one within a single worker process, in interleaved
rounds: {"results": [{"slice": "two_processes" | "one_process", "hosts", "us_per_node",
"nodes_per_second"}], "ratio_two_over_one": ...}.
Prints one JSON object to stdout: {"results": [{"compute_us", "pathways_per_second",
"jax_per_second", "ratio", ...}], ...}; progress goes to stderr. Contenders run in interleaved
rounds; each rate is the contender's best round, and ratio = pathways/jax of those. As this is
noisy on a shared machine, ratio_paired_median is also given: the median over rounds of
pathways/jax measured back to back in the same round (ratio_by_round lists them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

SIZES = (16, 64, 128, 256, 512)


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _rate(run_batch, calls_per_batch: int, seconds: float) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        run_batch()
        calls += calls_per_batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


def _round_rates(contenders, rounds: int, seconds: float) -> dict:
    """Rates of (name, run_batch, calls_per_batch) contenders, measured in interleaved rounds
    (so a burst of machine noise hits them alike): {name: [rate of each round]}."""
    for _, run_batch, _ in contenders:
        run_batch()  # Warm-up (compiles, first transfers).
    rates = {name: [] for name, _, _ in contenders}
    for _ in range(rounds):
        for name, run_batch, calls in contenders:
            rates[name].append(_rate(run_batch, calls, seconds / rounds))
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pw bench xla-overhead")
    parser.add_argument("--json", action="store_true", help="print one JSON object to stdout")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="seconds of measurement per contender and size")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds; each contender reports its best")
    parser.add_argument("--chain", type=int, default=32, help="calls per traced program")
    parser.add_argument("--sizes", type=str, default=",".join(map(str, SIZES)))
    parser.add_argument("--jax-backend", choices=("same-plugin", "builtin"), default="same-plugin",
                        help="which JAX client the ratio compares against (see module doc)")
    parser.add_argument("--cluster", type=str, default=None,
                        help="a running cluster: the chain across two processes vs within one")
    args = parser.parse_args(argv)
    if args.cluster is not None:
        return _cluster_main(args)

    import jax
    import jax.numpy as jnp

    import pathways as pw
    from pathways import _pathways

    plugin = _pathways.pjrt_plugin_path()
    if args.jax_backend == "same-plugin":
        # Before JAX creates any backend. (jax_plugins' documented way to load a plugin by path.)
        from jax._src import xla_bridge

        xla_bridge.register_plugin("pathways_plugin", priority=-1, library_path=plugin)
    backends = {"builtin": jax.devices()[0]}
    if args.jax_backend == "same-plugin":
        backends["same-plugin"] = jax.devices("pathways_plugin")[0]

    def f(x, w):
        return jnp.tanh(x @ w) * 0.5

    jf = jax.jit(f)
    devices = pw.make_virtual_device_set().add_slice(devices=1)
    pf = pw.pmap(f, devices=devices)

    @pw.program
    def chain(x, w):
        for _ in range(args.chain):
            x = pf(x, w)
        return x

    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(n)
        x0 = rng.standard_normal((n, n)).astype(np.float32)
        w0 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)

        # Compute time of one call: fastest of synchronous JAX calls.
        dev = backends[args.jax_backend]
        xj, wj = jax.device_put(x0, dev), jax.device_put(w0, dev)
        jf(xj, wj).block_until_ready()
        best = float("inf")
        for _ in range(20):
            t0 = time.perf_counter()
            jf(xj, wj).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        compute_us = best * 1e6
        batch = max(1, min(args.chain, int(0.05 / best)))  # JAX blocks every ~50 ms.

        contenders = []
        for name, d in backends.items():
            xb, wb = jax.device_put(x0, d), jax.device_put(w0, d)

            def jax_batch(xb=xb, wb=wb):
                y = xb
                for _ in range(batch):
                    y = jf(y, wb)
                y.block_until_ready()

            contenders.append(("jax:" + name, jax_batch, batch))

        # Pathways: arguments put once on the slice; every run chains `chain` calls.
        x_dev = pw.device_put(x0[None], devices)
        w_handle = pw.device_put(w0[None], devices)
        runs = max(1, batch // args.chain)

        def pw_batch():
            y = x_dev
            for _ in range(runs):
                y = chain(y, w_handle)
            y.block_until_ready()

        def pw_opbyop_batch():
            y = x_dev
            for _ in range(batch):
                y = pf(y, w_handle)
            y.block_until_ready()

        contenders += [("pathways", pw_batch, runs * args.chain),
                       ("pathways_opbyop", pw_opbyop_batch, batch)]
        per_round = _round_rates(contenders, args.rounds, args.min_seconds)
        rates = {name: max(r) for name, r in per_round.items()}  # Each contender's best round.
        jax_rate, pw_rate = rates["jax:" + args.jax_backend], rates["pathways"]
        opbyop_rate = rates["pathways_opbyop"]
        # Pathways against JAX in the same round (back to back), median over rounds.
        paired = [p / j for p, j in zip(per_round["pathways"], per_round["jax:" + args.jax_backend])]
        # Same result as JAX (both are XLA on this CPU).
        y_pw = np.asarray(chain(x0[None], w0[None]))[0]
        y_jax = x0
        for _ in range(args.chain):
            y_jax = np.asarray(jf(y_jax, w0))
        agree = bool(np.allclose(y_pw, y_jax, rtol=1e-4, atol=1e-5))
        row = {"n": n, "compute_us": round(compute_us, 2),
               "pathways_per_second": round(pw_rate, 1), "jax_per_second": round(jax_rate, 1),
               "ratio": round(pw_rate / jax_rate, 3),
               "ratio_paired_median": round(statistics.median(paired), 3),
               "ratio_by_round": [round(r, 3) for r in paired],
               "jax_builtin_per_second": round(rates["jax:builtin"], 1),
               "ratio_vs_jax_builtin": round(pw_rate / rates["jax:builtin"], 3),
               "pathways_opbyop_per_second": round(opbyop_rate, 1), "results_agree": agree}
        _log(json.dumps(row))
        results.append(row)

    out = {"benchmark": "xla-overhead", "chain": args.chain, "min_seconds": args.min_seconds,
           "rounds": args.rounds,
           "statistic": "best round of each contender; ratio_paired_median: median over rounds of "
                        "pathways/jax measured back to back in the same round",
           "jax_backend": args.jax_backend, "pjrt_plugin": plugin, "results": results}
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"compute {r['compute_us']:10.1f} us  pathways {r['pathways_per_second']:9.1f}/s"
                  f"  jax {r['jax_per_second']:9.1f}/s  ratio {r['ratio']:.3f}"
                  f"  (op-by-op {r['pathways_opbyop_per_second']:.1f}/s)")
    return 0 if all(r["results_agree"] for r in results) else 1


def _cluster_main(args) -> int:
    import jax

    import pathways as pw

    address = pw.connect(args.cluster or None)
    ds = pw.make_virtual_device_set()
    slices = {"two_processes": ds.add_slice(devices=2, placement="spread"),
              "one_process": ds.add_slice(devices=2, placement="host")}
    if len(set(slices["two_processes"].hosts)) != 2:
        raise SystemExit(f"the cluster at {address} has no island with two hosts: "
                         f"{slices['two_processes']}")
    x0 = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    programs, check = {}, None
    for name, s in slices.items():
        step = pw.pmap(lambda x: jax.numpy.tanh(jax.lax.psum(x, "i") * 0.5), devices=s,
                       axis_name="i")

        def chain(x, step=step):
            for _ in range(args.chain):
                x = step(x)
            return x

        chain.__name__ = f"chain_{name}"
        programs[name] = pw.program(chain)
        y = np.asarray(programs[name](x0))
        check = y if check is None else check
        if not np.allclose(y, check, rtol=1e-6):
            raise SystemExit(f"{name}: the chain computed {y}, the other slice {check}")
    runs = 10

    def batch(program):
        def run():
            y = x0
            for _ in range(runs):
                y = program(y)
            y.block_until_ready()
        return run

    contenders = [(name, batch(p), runs * args.chain) for name, p in programs.items()]
    per_round = _round_rates(contenders, args.rounds, args.min_seconds)
    results = []
    for name, s in slices.items():
        rate = max(per_round[name])
        results.append({"slice": name, "hosts": s.hosts, "nodes_per_second": round(rate, 1),
                        "us_per_node": round(1e6 / rate, 2)})
        _log(json.dumps(results[-1]))
    paired = [o / t for t, o in zip(per_round["two_processes"], per_round["one_process"])]
    out = {"benchmark": "xla-overhead", "cluster": address, "chain": args.chain,
           "rounds": args.rounds, "statistic": "best round of each slice",
           "results": results,
           "ratio_two_over_one": round(results[0]["us_per_node"] / results[1]["us_per_node"], 3),
           "ratio_two_over_one_paired_median": round(statistics.median(paired), 3)}
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"{r['slice']:14s} hosts {r['hosts']}  {r['us_per_node']:9.1f} us/node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
