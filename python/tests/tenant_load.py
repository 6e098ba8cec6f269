"""A tenant: a client named argv[1] calling two functions in turn on a slice of argv[2] devices,
in a loop for argv[3] seconds (the dashboard's and the multi-tenant traces' load). Optional:
argv[4] floats per shard (default 64), argv[5] the island to use (default: any), argv[6] its
share (it connects as tenant argv[1] with it; default: a tenant of its own, share 1), argv[7]
calls kept in flight (default 2: it waits after each pair)."""
import sys
import time

import numpy as np

import pathways as pw

name, devices, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
width = int(sys.argv[4]) if len(sys.argv) > 4 else 64
island = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] != "-" else None
share = float(sys.argv[6]) if len(sys.argv) > 6 else None
in_flight = int(sys.argv[7]) if len(sys.argv) > 7 else 2
client = pw.Client(name, tenant=name.replace(" ", "-") if share else None, share=share)
s = client.make_virtual_device_set().add_slice(devices=devices, island=island)
f = pw.pmap(lambda x: x * 2.0 + 1.0, devices=s)
g = pw.pmap(lambda x: x - 1.0, devices=s)
x = pw.device_put(np.ones((devices, width), np.float32), s)
end = time.monotonic() + seconds
calls = 0
while time.monotonic() < end:
    x = g(f(x))  # Asynchronous calls; the arrays stay on the devices.
    calls += 2
    if calls % in_flight == 0:
        x.block_until_ready()
x.block_until_ready()
