"""The JAX client as JAX users write it (issue 21): pmap's arguments, pw.jit with PartitionSpecs,
resharding between slices, Array operations on the devices, placement and status.

On the embedded cluster (2 islands x 1 host x 4 devices) under plain pytest; test_cluster.py runs
this file again with PW_CLUSTER naming a `pw up` cluster (2 islands x 2 hosts x 2 devices), where
slices span worker processes. pw.jit's SPMD modules need their slice on one host (in both modes):
there they get a one-host slice.
"""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw


ON_CLUSTER = bool(os.environ.get("PW_CLUSTER"))


def mesh_slice(ds, names=("data", "model")):
    """A 2-axis mesh for pw.jit: 2 x 2 on an island's one host here; 1 x 2 on one host of a
    process cluster."""
    if ON_CLUSTER:
        return ds.add_slice(mesh=(1, 2), axis_names=names, placement="host")
    return ds.add_slice(mesh=(2, 2), axis_names=names)


def close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.fixture
def ds():
    return pw.make_virtual_device_set()


def test_every_jax_dtype_round_trips_and_runs(ds):
    import ml_dtypes
    s = ds.add_slice(devices=2, placement="spread")  # On a process cluster: two worker processes.
    base = np.arange(6).reshape(2, 3) % 3
    for dt in (ml_dtypes.bfloat16, np.float16, np.float32, np.float64, np.int8, np.int16,
               np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_,
               np.complex64):
        x = base.astype(dt)
        x.setflags(write=False)
        back = np.asarray(pw.device_put(x, s))
        assert back.dtype == np.dtype(dt) and back.shape == (2, 3), (dt, back.dtype)
        np.testing.assert_array_equal(back, x)
    # Computed by XLA (64-bit inputs export in JAX's x64 mode).
    f = pw.pmap(lambda v: v * 2, devices=s)
    for dt in (ml_dtypes.bfloat16, np.float16, np.float32, np.float64, np.int8, np.int16,
               np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_,
               np.complex64):
        x = base.astype(dt)
        want = x * np.array(2, dtype=np.int8 if dt is np.bool_ else dt)
        if dt is np.bool_:
            want = np.asarray(jnp.asarray(x) * 2)  # JAX's promotion: bool * int -> int32.
        got = np.asarray(f(x))
        assert got.dtype == want.dtype, (dt, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)


def test_in_axes_broadcast_a_weight_and_a_scalar_as_jax_pmap(ds):
    s = ds.add_slice(devices=2)
    x = jax.random.normal(jax.random.key(0), (2, 5, 3))  # jax.Arrays, no np.array(...) wrapping.
    w = jnp.ones((3, 4)) * 0.5
    step = pw.pmap(lambda x, w, lr: jnp.tanh(x @ w) * lr, devices=s, in_axes=(0, None, None))
    out = step(x, w, 0.1)  # A Python scalar, broadcast.
    assert out.shape == (2, 5, 4)
    close(out, jax.vmap(lambda x: jnp.tanh(x @ w) * 0.1)(x))
    # Pytree prefixes: a dict of parameters broadcast whole, the batch split.
    params = {"w": w, "b": jnp.arange(4.0)}
    net = pw.pmap(lambda p, x: x @ p["w"] + p["b"], devices=s, in_axes=({"w": None, "b": None}, 0))
    close(net(params, x), jax.vmap(lambda x: x @ w + params["b"])(x))
    # A 0-d numpy argument and a 0-d result per device (stacked to shape (2,)).
    total = pw.pmap(lambda x, k: (x * k).sum(), devices=s, in_axes=(0, None))
    close(total(x, np.float32(2.0)), (x * 2).sum(axis=(1, 2)))


def test_in_axes_and_out_axes_other_than_the_leading_one(ds):
    s = ds.add_slice(devices=2)
    y = np.arange(24, dtype=np.float32).reshape(3, 2, 4)
    f = pw.pmap(lambda v: v.sum(0) * 2, devices=s, in_axes=1, out_axes=1)
    want = np.stack([y[:, i].sum(0) * 2 for i in range(2)], axis=1)
    out = f(y)
    assert out.shape == (4, 2)
    close(out, want)
    # out_axes=None: one value (here the same on every device, by a collective).
    mean = pw.pmap(lambda v: jax.lax.pmean(v, "i"), devices=s, axis_name="i", out_axes=None)
    close(mean(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)), [2.0, 4.0])
    with pytest.raises(ValueError, match=r"size 3 along in_axes 0 .*slice has 2 devices"):
        f2 = pw.pmap(lambda v: v, devices=s)
        f2(y)


def test_a_function_that_ignores_an_argument_runs(ds):
    # jax.jit drops unused arguments from what it compiles unless told to keep them: the module
    # then took fewer arguments than the runtime passed ("supplied 2 arguments but compiled
    # program expected 1"). A stage's backward that leaves one of its forward's residuals unused
    # did this.
    s = ds.add_slice(devices=2)
    x, y = np.arange(4, dtype=np.float32).reshape(2, 2), np.ones((2, 2), np.float32)
    close(pw.pmap(lambda a, b: a * 2, devices=s)(x, y), x * 2)
    close(pw.jit(lambda a, b: a * 2, ds.add_slice(devices=1))(x, y), x * 2)
    m = mesh_slice(ds)  # pw.jit's SPMD modules: one process on a process cluster.
    close(pw.jit(lambda a, b: a + 1, m, in_shardings=P("data"))(x, y), x + 1)


def test_static_arguments_and_jit_with_static_argnums_inside(ds):
    s = ds.add_slice(devices=2)

    @jax.jit
    def inner(x):
        return x * 3

    tile = jax.jit(lambda x, reps: jnp.tile(x, reps), static_argnums=1)
    f = pw.pmap(lambda x, reps, scale: tile(inner(x), reps) * scale, devices=s,
                static_broadcasted_argnums=(1, 2))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = f(x, 2, 0.5)
    assert out.shape == (2, 6)
    close(out, np.tile(x * 3, (1, 2)) * 0.5)
    close(f(x, 1, 1.0), x * 3)  # Other static values: another binding.
    with pytest.raises(ValueError, match="static argument 1 must be hashable"):
        f(x, [2], 1.0)


def test_donated_arguments_are_deleted_once_dispatched(ds):
    s = ds.add_slice(devices=2)
    a = pw.device_put(np.ones((2, 3), np.float32), s)
    inc = pw.pmap(lambda x: x + 1, devices=s, donate_argnums=0)
    b = inc(a)
    assert a.is_deleted() and not b.is_deleted()
    close(b, np.full((2, 3), 2.0))
    with pytest.raises(RuntimeError, match="deleted"):
        inc(a)

    @pw.program(donate_argnums=(0,))
    def twice(v):
        return inc(inc(v))
    c = twice(b)
    assert b.is_deleted()
    close(c, np.full((2, 3), 4.0))


def test_partition_spec_sharded_matmuls_equal_plain_jax(ds):
    m = mesh_slice(ds)
    assert m.mesh_shape == ((1, 2) if ON_CLUSTER else (2, 2)) and m.axis_names == ("data", "model")
    k = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(k[0], (8, 16))
    w1 = jax.random.normal(k[1], (16, 32)) / 4
    w2 = jax.random.normal(k[2], (32, 16)) / 4
    # Megatron-style: w1 split by columns, w2 by rows over "model"; XLA inserts the all-reduce.
    mlp = pw.jit(lambda x, w1, w2: jnp.tanh(x @ w1) @ w2, devices=m,
                 in_shardings=(P("data", None), P(None, "model"), P("model", None)),
                 out_shardings=P("data", None))
    out = mlp(x, w1, w2)
    close(out, jnp.tanh(x @ w1) @ w2)
    assert out.sharding.spec == P("data") and out.sharding.mesh_shape == m.mesh_shape
    # The weights put once, sharded, and reused (they stay on the devices).
    w1d = pw.device_put(w1, m, P(None, "model"))
    assert w1d.sharding.spec == P(None, "model")
    assert w1d.sharding.shard_shape(w1.shape) == (16, 16)
    assert w1d.devices() == {pw.Device(d, h) for d, h in zip(m.devices, m.hosts)}
    close(mlp(x, w1d, w2), out)

    # Tensor parallelism written with shard_map over the slice's mesh.
    def tp(x, w1, w2):
        h = jnp.tanh(x @ w1)
        return jax.lax.psum(h @ w2, "model")
    f = pw.jit(jax.shard_map(tp, mesh=m.mesh, in_specs=(P("data"), P(None, "model"), P("model")),
                             out_specs=P("data")), devices=m,
               in_shardings=(P("data"), P(None, "model"), P("model")), out_shardings=P("data"))
    close(f(x, w1, w2), jnp.tanh(x @ w1) @ w2)
    with pytest.raises(ValueError, match="names 'expert', not an axis of the slice's mesh"):
        pw.jit(lambda x: x, devices=m, in_shardings=P("expert"))(x)
    with pytest.raises(ValueError, match="split over mesh axes \\('data', 'model'\\)"):
        pw.jit(lambda x: x, devices=m, in_shardings=P(("data", "model")))(x)


def test_resharding_between_slices_of_two_four_and_one_devices(ds):
    s2, s4, s1 = ds.add_slice(devices=2), ds.add_slice(devices=4), ds.add_slice(devices=1)
    rows = pw.pmap(lambda r: r * 2, devices=s2)                        # [2, 4] by rows on 2.
    cols = pw.pmap(lambda c: c + 1, devices=s4, in_axes=1, out_axes=1)  # [2, 4] by columns on 4.
    whole = pw.jit(lambda a: a.sum(axis=0), devices=s1)                 # [2, 4] whole on 1.
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    @pw.program
    def chain(v):
        return whole(cols(rows(v)))
    close(chain(x), (x * 2 + 1).sum(axis=0))
    # Between programs: each one's result feeds a function on another slice.
    a = rows(x)
    b = cols(a)
    assert b.sharding.spec == P(None, "devices") and len(b.devices()) == 4
    c = whole(b)
    assert len(c.devices()) == 1
    close(c, (x * 2 + 1).sum(axis=0))
    # And pw.jit's shardings: rows on 2 -> columns on a 2 x 2 mesh.
    m = mesh_slice(ds, ("a", "b"))
    t = pw.jit(lambda v: v * 10, devices=m, in_shardings=P("b", "a"), out_shardings=P(None, "b"))
    close(t(a), x * 20)


def test_array_operations_run_on_the_devices(ds):
    s = ds.add_slice(devices=2)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    a = pw.device_put(x, s)
    for got, want in [(a + 1, x + 1), (2 * a, 2 * x), (a - a, x - x), (1.0 / (a + 1), 1 / (x + 1)),
                      (-a, -x), (a ** 2, x ** 2), (a % 4, x % 4), (a > 5, x > 5),
                      (a + np.arange(6, dtype=np.float32), x + np.arange(6)),
                      (a[0], x[0]), (a[:, 1:3], x[:, 1:3]), (a[..., None], x[..., None]),
                      (a.reshape(3, 4), x.reshape(3, 4)), (a.T, x.T), (a @ a.T, x @ x.T),
                      (a.astype(jnp.bfloat16).astype(np.float32), x), (a.sum(), x.sum()),
                      (a.mean(axis=1), x.mean(axis=1)), (np.float32(3) * a, 3 * x)]:
        assert isinstance(got, pw.Array), type(got)
        close(got, want)
    assert (a + 1).dtype == np.float32  # A Python scalar is weakly typed, as in JAX.
    assert (a + 1).sharding.spec == a.sharding.spec == P("devices")  # Elementwise: kept.
    assert (a.reshape(3, 4)).sharding.is_fully_replicated
    assert (a + 1).devices() == a.devices() == {pw.Device(d, h) for d, h in zip(s.devices, s.hosts)}
    idx = a.sharding.devices_indices_map(x.shape)
    assert [idx[d] for d in a.sharding.devices] == [(slice(0, 1), slice(None)),
                                                    (slice(1, 2), slice(None))]
    b = pw.device_put(np.ones((2, 6), np.float32), ds.add_slice(devices=2))
    close(a + b, x + 1)  # Another slice's array: moved to a's slice by the runtime.
    with pytest.raises(TypeError, match=r"Array reshape\(5, 5\): cannot reshape array of shape \(2, 6\)"):
        a.reshape(5, 5)


def test_placement_by_island_host_and_avoiding_a_slice(ds):
    first = ds.add_slice(devices=2, island=1)
    assert first.islands == [1]
    other = ds.add_slice(devices=2, avoid=first)
    assert other.islands == [0]
    again = ds.add_slice(devices=4, island=[1])  # Not the least-loaded island: asked for.
    assert again.islands == [1]
    h = first.hosts[0]
    on = ds.add_slice(devices=2, hosts=h)
    assert set(on.hosts) == {h}
    with pytest.raises(pw.errors.ResourceExhausted, match=rf"on hosts \[{h}\], but only"):
        ds.add_slice(devices=5, hosts=[h])
    with pytest.raises(pw.errors.ResourceExhausted, match=r"in islands \[7\], but only 0 alive"):
        ds.add_slice(devices=1, island=7)
    with pytest.raises(pw.errors.ResourceExhausted,
                       match=r"2 devices avoiding islands \[0, 1\], but only 0 alive"):
        ds.add_slice(devices=2, avoid=[first, other])
    with pytest.raises(ValueError, match="mesh \\(2, 2\\) holds 4 devices, not 2"):
        ds.add_slice(devices=2, mesh=(2, 2), axis_names=("a", "b"))
    with pytest.raises(ValueError, match="needs axis_names"):
        ds.add_slice(mesh=(2, 2))
    with pytest.raises(TypeError, match="must be a pathways Slice"):
        pw.pmap(lambda x: x, devices=4)


JIT_ACROSS_HOSTS = (
    "import numpy as np, pathways as pw\n"
    "from jax.sharding import PartitionSpec as P\n"
    "s = pw.make_virtual_device_set().add_slice(devices=2, placement='spread')\n"
    "assert len(set(s.hosts)) == 2, s.hosts\n"
    "f = pw.jit(lambda v: v * 2, devices=s, in_shardings=P('devices'),\n"
    "           out_shardings=P('devices'))\n"
    "try:\n"
    "    f(np.ones(4, np.float32))\n"
    "except pw.errors.FailedPrecondition as e:\n"
    "    print(e)\n")


def test_jit_on_a_slice_spanning_hosts_is_refused_at_bind_naming_what_to_do():
    # Two hosts: two worker processes on a process cluster; on an embedded cluster of 2 hosts
    # per island (a subprocess), two hosts with a PJRT client each, refused the same way.
    env = dict(os.environ) if ON_CLUSTER else dict(os.environ, PW_HOSTS_PER_ISLAND="2",
                                                   PW_DEVICES_PER_HOST="2")
    run = subprocess.run([sys.executable, "-c", JIT_ACROSS_HOSTS], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search("spans 2 hosts.*placement=host", run.stdout), run.stdout


def test_status_in_python_is_pw_status_json():
    st = pw.status()
    assert {"clients", "runs_in_flight", "runs_completed", "logical_buffers", "hosts",
            "scheduler_queue_depth", "scheduler_round_trip_ms", "running",
            "ici_bytes_received"} <= set(st)
    assert len(st["scheduler_round_trip_ms"]) == len(st["scheduler_queue_depth"])
    assert st["clients"] >= 1 and all(h["alive"] for h in st["hosts"])
    if ON_CLUSTER:
        assert st["address"] == os.environ["PW_CLUSTER"]
        assert [h["island"] for h in st["hosts"]] == [0, 0, 1, 1]
        assert all(h["address"].startswith("127.0.0.1:") for h in st["hosts"])
        assert len(st["hosts"][0]["devices"]) == 2
    else:
        assert st["address"] == "embedded"
        assert [h["island"] for h in st["hosts"]] == [0, 1]
        assert all(h["address"] == "in-process" for h in st["hosts"])
        assert len(st["hosts"][0]["devices"]) == 4
    before = sum(h["functions"] for h in st["hosts"])
    f = pw.pmap(lambda x: x * 7, devices=pw.make_virtual_device_set().add_slice(devices=2))
    close(f(np.ones((2, 2), np.float32)), np.full((2, 2), 7.0))
    assert sum(h["functions"] for h in pw.status()["hosts"]) > before


@pytest.mark.skipif(ON_CLUSTER, reason="embedded: test_cluster.py checks the workers' logs")
def test_logs_are_quiet_by_default_and_pw_log_level_shows_xlas():
    code = ("import numpy as np, pathways as pw\n"
            "from jax.sharding import PartitionSpec as P\n"
            "m = pw.make_virtual_device_set().add_slice(mesh=(2,), axis_names=('x',))\n"
            "f = pw.jit(lambda v: v * 2, devices=m, in_shardings=P('x'), out_shardings=P('x'))\n"
            "print(np.asarray(f(np.ones(4, np.float32))).tolist())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PW_LOG_LEVEL")}
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "[2.0, 2.0, 2.0, 2.0]"
    assert quiet.stderr == "", quiet.stderr
    loud = subprocess.run([sys.executable, "-c", code], env=dict(env, PW_LOG_LEVEL="info"),
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and "shardy" in loud.stderr, loud.stderr


def test_arrays_shared_between_clients_follow_their_token_until_revoked(ds):
    s = ds.add_slice(devices=2)
    w = pw.device_put(np.arange(4, dtype=np.float32).reshape(2, 2), s)
    token = w.share()
    server = pw.Client("server")  # Another client (on a process cluster it could be anywhere).
    ss = server.make_virtual_device_set().add_slice(devices=2, avoid=s)
    assert ss.islands != s.islands
    times10 = pw.pmap(lambda x: x * 10, devices=ss)
    got = pw.Array.from_shared(token, client=server)
    assert got.devices() == w.devices()  # The owner's buffer itself, not a copy.
    close(times10(got), np.arange(4).reshape(2, 2) * 10)
    with pytest.raises(ValueError, match="another client's slice"):
        got + 1  # Operations run on the array's slice, which is not the server's.
    # The owner publishes a new value under the same token; the server sees it on import.
    w2 = pw.device_put(np.ones((2, 2), np.float32), s)
    assert w2.share(token=token) == token
    close(times10(pw.Array.from_shared(token, client=server)), np.full((2, 2), 10.0))
    mine = pw.device_put(np.zeros((2, 2), np.float32), ss)
    with pytest.raises(pw.errors.PermissionDenied, match="read-only"):
        mine.share(token=token)
    rw = w.share(writable=True)
    mine.share(token=rw)  # A writable token's holder publishes its own array.
    close(pw.Array.from_shared(rw), np.zeros((2, 2)))
    with pytest.raises(pw.errors.PermissionDenied, match="only the share's owner"):
        server.revoke(token)
    pw.revoke(token)
    with pytest.raises(pw.errors.NotFound, match="since revoked"):
        np.asarray(got)
    with pytest.raises(pw.errors.NotFound, match="no share has this token"):
        pw.Array.from_shared(token, client=server)
    close(w, np.arange(4).reshape(2, 2))  # The owner's own arrays stay.


def test_metrics_of_this_cluster_count_its_runs():
    # Issue 22 items 2 and 5: the embedded cluster serves the metrics a process cluster does
    # (on a process cluster this returns the controller's endpoint).
    import re
    import urllib.request

    address = pw.serve_metrics()

    def scrape(a):
        text = urllib.request.urlopen(f"http://{a}/metrics", timeout=10).read().decode()
        return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in
                re.finditer(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", text, re.M)}
    before = scrape(address)
    f = pw.pmap(lambda x: x - 1, devices=pw.make_virtual_device_set().add_slice(devices=2))
    for _ in range(5):
        f(np.ones((2, 2), np.float32)).block_until_ready()
    after = scrape(address)
    assert after['pw_runs_total{code="OK"}'] - before.get('pw_runs_total{code="OK"}', 0) == 5
    assert after["pw_runs_completed_total"] - before["pw_runs_completed_total"] == 5
    assert after["pw_clients"] >= 1
    if not ON_CLUSTER:  # A process cluster's devices are on its workers' endpoints.
        done = [sum(v for k, v in s.items() if k.startswith("pw_device_computations_total"))
                for s in (before, after)]
        assert done[1] - done[0] == 5 * 2
