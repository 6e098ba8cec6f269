"""A client that runs a 2-island program (a psum on island 0's slice, its result moved over DCN
to island 1's slice, another step there) `runs` times, under pw.trace unless the trace path is
"-" (then only the cluster's own tracer records it: pw trace, PW_TRACE).

    python traced_two_islands.py TRACE.json INFO.json RUNS DEVICES_PER_SLICE [MEET_DIR]

INFO.json gets {"islands": {"0": [device ids], "1": [...]}, "shard_bytes": n}. With MEET_DIR,
a traced client and an untraced one meet there, so that all of the untraced one's runs fall
inside the other's trace: the untraced one starts once the trace has, and the trace ends once
the untraced one is done."""
import contextlib
import json
import os
import sys
import time

import jax
import numpy as np

import pathways as pw

trace_path, info_path, runs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
meet = sys.argv[5] if len(sys.argv) > 5 else None


def wait_for(name):
    deadline = time.monotonic() + 240
    while not os.path.exists(os.path.join(meet, name)):
        if time.monotonic() > deadline:
            raise SystemExit(f"the other client never wrote {name}")
        time.sleep(0.01)


def mark(name):
    open(os.path.join(meet, name), "w").close()


vds = pw.make_virtual_device_set()
a = vds.add_slice(devices=n, island=0)
b = vds.add_slice(devices=n, island=1)
f = pw.pmap(lambda x: jax.lax.psum(x, "i") * 2, devices=a, axis_name="i")
g = pw.pmap(lambda x: x + 1, devices=b)
p = pw.program(lambda v: g(f(v)))
x = np.ones((n, 3), np.float32)
traced = trace_path != "-"
with pw.trace(trace_path) if traced else contextlib.nullcontext():
    if meet and traced:
        mark("traced")
    elif meet:
        wait_for("traced")
    for _ in range(runs):
        out = p(x)
        out.block_until_ready()
    if meet and traced:
        wait_for("untraced-done")
    elif meet:
        mark("untraced-done")
np.testing.assert_allclose(np.asarray(out), np.full((n, 3), 2 * n + 1, np.float32))
with open(info_path, "w") as fh:
    json.dump({"islands": {"0": a.devices, "1": b.devices}, "shard_bytes": 3 * 4}, fh)
