"""A client that runs a 2-island program (a psum on island 0's slice, its result moved over DCN
to island 1's slice, another step there) `runs` times, under pw.trace unless the trace path is
"-" (then only the cluster's own tracer records it: pw trace, PW_TRACE).

    python traced_two_islands.py TRACE.json INFO.json RUNS DEVICES_PER_SLICE

INFO.json gets {"islands": {"0": [device ids], "1": [...]}, "shard_bytes": n}."""
import contextlib
import json
import sys

import jax
import numpy as np

import pathways as pw

trace_path, info_path, runs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
vds = pw.make_virtual_device_set()
a = vds.add_slice(devices=n, island=0)
b = vds.add_slice(devices=n, island=1)
f = pw.pmap(lambda x: jax.lax.psum(x, "i") * 2, devices=a, axis_name="i")
g = pw.pmap(lambda x: x + 1, devices=b)
p = pw.program(lambda v: g(f(v)))
x = np.ones((n, 3), np.float32)
with pw.trace(trace_path) if trace_path != "-" else contextlib.nullcontext():
    for _ in range(runs):
        out = p(x)
        out.block_until_ready()
np.testing.assert_allclose(np.asarray(out), np.full((n, 3), 2 * n + 1, np.float32))
with open(info_path, "w") as fh:
    json.dump({"islands": {"0": a.devices, "1": b.devices}, "shard_bytes": 3 * 4}, fh)
