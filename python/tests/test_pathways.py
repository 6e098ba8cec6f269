import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pathways as pw

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_figure2_example_prints_the_papers_output():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "figure2.py")],
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "(array([3., 5.]), array([2., 4.]))"


def test_a_failed_embedded_host_loses_its_arrays_and_a_restarted_one_serves_again():
    # As a killed worker on `pw up` (test_cluster.py), in an embedded cluster of its own.
    code = """
import numpy as np
import pathways as pw
cluster = pw._default_connection().cluster
s = pw.make_virtual_device_set().add_slice(devices=4)
assert sorted(set(s.hosts)) == [0, 1], s.hosts
double = pw.pmap(lambda x: x * 2.0, devices=s)
x = pw.device_put(np.arange(4, dtype=np.float32), s)
np.testing.assert_array_equal(double(x), [0, 2, 4, 6])
cluster.fail_host(1, "a drill")
try:
    np.asarray(x)
    raise SystemExit("read an array of a failed host")
except pw.errors.DataLoss as e:
    assert "host:1 failed: a drill" in str(e), e
try:
    np.asarray(double(np.ones(4, np.float32)))
    raise SystemExit("ran on a failed host")
except pw.errors.Unavailable as e:
    assert "host:1 failed: a drill" in str(e), e
hosts = pw.status()["hosts"]
assert [h["alive"] for h in hosts] == [True, False], hosts
assert hosts[1]["reason"] == "a drill", hosts[1]
cluster.restart_host(1)
assert [h["alive"] for h in pw.status()["hosts"]] == [True, True]
np.testing.assert_array_equal(double(np.ones(4, np.float32)), [2, 2, 2, 2])
for lost in (lambda: np.asarray(x), lambda: np.asarray(double(x))):  # Still lost.
    try:
        lost()
        raise SystemExit("read a lost array after the restart")
    except pw.errors.DataLoss as e:
        assert "was lost: host:1 failed: a drill" in str(e), e
print("ok")
"""
    env = dict(os.environ, PW_ISLANDS="1", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    env.pop("PW_CLUSTER", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


def test_program_is_one_dataflow_program():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    double = pw.pmap(lambda x: x * 2.0, devices=s)

    @pw.program
    def twice(v):
        return double(double(v))

    np.testing.assert_array_equal(twice(np.array([1.0, 2.0], np.float32)), [4.0, 8.0])
    graph = twice.explain(np.array([1.0, 2.0], np.float32))
    assert graph.count("Compute") == 2 and "Arg" in graph and "Result" in graph


def test_op_by_op_call_outside_a_program():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    inc = pw.pmap(lambda x: x + 1, devices=s)
    np.testing.assert_array_equal(inc(np.array([1, 2], np.int32)), [2, 3])


def test_errors_are_python_exceptions_with_the_status_message():
    with pytest.raises(RuntimeError, match="devices"):
        pw.make_virtual_device_set().add_slice(devices=10_000)
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x * 2.0, devices=s)
    with pytest.raises(ValueError, match="size 3 along in_axes 0 .* the slice has 2 devices"):
        pw.program(lambda v: f(v))(np.zeros((3,), np.float32))  # 3 rows over 2 devices


def test_results_are_handles_that_stay_on_the_devices():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    inc = pw.pmap(lambda x: x + 1.0, devices=s)

    @pw.program
    def step(v):
        return inc(v)

    h = step(np.array([1.0, 2.0], np.float32))
    assert isinstance(h, pw.Array)
    assert h.shape == (2,) and h.dtype == np.float32
    assert h.block_until_ready() is h
    for _ in range(3):  # Handles feed the next run without a trip through the host.
        h = step(h)
    np.testing.assert_array_equal(np.asarray(h), [5.0, 6.0])
    assert repr(h) == repr(np.array([5.0, 6.0], np.float32))


def test_pytrees_in_and_out():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda p, x: {"y": p["w"] * x + p["b"], "x": x}, devices=s)

    @pw.program
    def g(params, x):
        return f(params, x)

    params = {"w": np.array([2.0, 3.0], np.float32), "b": np.array([1.0, 1.0], np.float32)}
    out = g(params, np.array([10.0, 20.0], np.float32))
    assert set(out) == {"x", "y"}
    np.testing.assert_array_equal(np.asarray(out["y"]), [21.0, 61.0])


# Issue 21 item 1: jax.Array inputs (and read-only numpy, which np.asarray(jax_array) is) were
# refused by the binding ("incompatible function arguments"); results ignored `copy`.
def test_jax_arrays_read_only_and_strided_numpy_are_inputs():
    import jax.numpy as jnp
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x + 1.0, devices=s)
    read_only = np.ones((2, 3), np.float32)
    read_only.setflags(write=False)
    strided = np.ones((3, 2), np.float32).T
    for x in (jnp.ones((2, 3), jnp.float32), read_only, strided):
        np.testing.assert_array_equal(np.asarray(f(x)), np.full((2, 3), 2.0))
    g = pw.program(lambda d: {"a": f(d["a"]), "b": f(d["b"])})
    out = g({"a": jnp.zeros((2, 3), jnp.float32), "b": read_only})
    np.testing.assert_array_equal(np.asarray(out["a"]), np.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(pw.device_put(jnp.arange(4.0).reshape(2, 2), s)),
                                  [[0.0, 1.0], [2.0, 3.0]])


def test_results_read_as_jax_arrays_do_copy_readiness_and_delete():
    import jax.numpy as jnp
    s = pw.make_virtual_device_set().add_slice(devices=2)
    y = pw.pmap(lambda x: x * 2.0, devices=s)(np.ones((2, 2), np.float32))
    assert y.block_until_ready().is_ready()
    view = np.asarray(y)
    assert not view.flags.writeable  # As jax.Array's: the array's own values, kept.
    mine = np.array(y)  # copy=True
    mine[0, 0] = 7.0
    np.testing.assert_array_equal(np.asarray(y), np.full((2, 2), 2.0))
    assert np.asarray(y, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="needs a copy"):
        np.asarray(y, dtype=np.float64, copy=False)
    j = jnp.asarray(y)
    assert j.dtype == jnp.float32 and float(j.sum()) == 8.0
    import jax
    d = jax.dlpack.from_dlpack(y)  # DLPack: a jax.Array of its own.
    assert d.shape == (2, 2) and float(d.sum()) == 8.0
    assert np.from_dlpack(y).flags.writeable
    y.delete()
    assert y.is_deleted()
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        np.asarray(y)


def test_collectives_inside_a_function_span_the_slice():
    s = pw.make_virtual_device_set().add_slice(devices=4)
    import jax
    total = pw.pmap(lambda x: jax.lax.psum(x, "i"), devices=s, axis_name="i")
    gathered = pw.pmap(lambda x: jax.lax.all_gather(x, "i").sum(0) - x, devices=s, axis_name="i")
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(np.asarray(total(x)), np.tile(x.sum(0), (4, 1)))

    @pw.program
    def both(v):
        return gathered(total(v))

    np.testing.assert_array_equal(np.asarray(both(x)), np.tile(3 * x.sum(0), (4, 1)))


def test_a_functions_collectives_run_in_one_order_on_every_shard():
    # XLA runs independent side-effecting custom calls in whatever order they become ready, and
    # that order differed between shards: with several independent psums (a pmean of a gradient
    # pytree) shards waited in different rendezvous forever. Each collective now takes the
    # previous one's output as its `after` operand, and a loop holding collectives starts after
    # them (pw_after) and is followed by the next.
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
    from pathways import _collectives

    def f(a, b, c):
        a, b = jax.lax.psum(a, "i"), jax.lax.psum(b, "i")
        c = jax.lax.fori_loop(0, 3, lambda k, v: jax.lax.psum(v, "i") * 0.5, c)
        return a + jax.lax.psum(b + c, "i")

    mesh = AbstractMesh((4,), ("i",))
    mapped = jax.shard_map(lambda *bs: [f(*(b[0] for b in bs))[None]], mesh=mesh,
                           in_specs=P("i"), out_specs=P("i"), check_vma=False)
    stacked = [jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=NamedSharding(mesh, P("i")))] * 3
    body = _collectives.shard_map_body(jax.make_jaxpr(jax.jit(mapped))(*stacked))
    shard = _collectives.per_shard_function(body, ("i",), (4,))
    jaxpr = jax.make_jaxpr(lambda *xs: shard(*(x[None] for x in xs)))(
        *[jax.ShapeDtypeStruct((3,), jnp.float32)] * 3).jaxpr
    calls = [e for e in jaxpr.eqns if e.primitive.name == "ffi_call"]
    assert [e.params["target_name"] for e in calls] == [
        "pw_all_reduce", "pw_all_reduce", "pw_after", "pw_all_reduce"]
    first, second, after, last = calls
    assert second.invars[-1] is first.outvars[0]
    assert after.invars[-1] is second.outvars[0]
    loop = next(e for e in jaxpr.eqns if e.primitive.name in ("scan", "while"))
    assert after.outvars[0] in loop.invars
    assert last.invars[-1] in loop.outvars


def test_a_pmean_of_many_gradients_runs_step_after_step():
    # The behaviour the order above guards: 38 independent all-reduces per call, 30 calls.
    import jax
    s = pw.make_virtual_device_set().add_slice(devices=4)
    leaves = 37
    step = pw.pmap(lambda xs: jax.lax.pmean(xs, "i"), devices=s, axis_name="i")
    xs = [np.full((4, 8), float(k), np.float32) for k in range(leaves)]
    for _ in range(30):
        xs = step(xs)
    for k, x in enumerate(xs):
        np.testing.assert_array_equal(np.asarray(x), np.full((4, 8), float(k)))


def test_bad_calls_raise_with_the_status_message():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x * 2.0, devices=s)
    prog = pw.program(lambda v: f(v))
    h = prog(np.ones((2, 3), np.float32))
    traced = prog._trace(*prog._leaves((np.ones((2, 3), np.float32),)))[0]
    with pytest.raises(RuntimeError, match=r"argument 0 expects f32\[2,3\], got f32\[2,4\]"):
        traced.put_arg(0, *pw._layout.raw(np.ones((2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"in_axes 0 for input 0 of shape \(\) is out of range"):
        prog(np.float32(1.0))
    np.testing.assert_array_equal(np.asarray(h), np.full((2, 3), 2.0))  # Still serving.


def test_lm_trains_in_three_layouts_that_match_one_device():
    env = dict(os.environ, PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "lm" / "train.py"), "--json",
                          "--timed-steps", "3"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout.splitlines()[-1])["results"]
    assert [r["layout"] for r in results] == ["spmd", "pipeline", "pipeline_2islands"]
    assert results[0]["mesh"] == {"data": 2, "model": 2}  # Data x model parallel.
    for r in results:
        assert r["loss_rel_diff_vs_one_device"] <= 1e-5 and r["params_rel_diff_vs_one_device"] <= 1e-5
        assert r["losses"][-1] < r["losses"][0] and r["tokens_per_second"] > 0


def test_lm_is_served_from_its_live_weights_while_it_trains():
    # examples/lm/serve.py on the embedded cluster of the README's shape: a server client (tenant
    # "serve") answers prompts while the trainer runs, and its answer with the final weights is
    # the reference model's greedy generation with the trainer's final parameters.
    env = dict(os.environ, PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "lm" / "serve.py"), "--json",
                          "--steps", "12"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["ok"] and r["logit_gap"] <= 1e-4 and len(r["final_text"]) > 0, r
    assert r["requests"] > 0 and 0 < r["latency_ms_p50"] <= r["latency_ms_p99"], r
    assert r["train_tokens_per_second_alone"] > 0 and r["train_tokens_per_second_serving"] > 0


def test_lm_recovers_from_a_lost_host_from_its_last_checkpoint():
    # examples/lm/recover.py on the embedded cluster of the README's shape: host 1's devices are
    # removed mid-training; the next step fails naming the host, the trainer restores the last
    # checkpoint onto two devices that remain, and its last loss matches plain JAX's
    # uninterrupted run.
    env = dict(os.environ, PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "lm" / "recover.py"), "--json"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout.splitlines()[-1])
    assert "host:1" in r["error"], r
    assert r["loss_rel_diff_vs_one_device"] <= 1e-5 and r["recovery_seconds"] > 0, r
    assert not set(r["devices_after"]) & {2, 3}, r  # Host 1's devices.
    assert "restored step 4's checkpoint" in out.stderr, out.stderr


def test_mlp_data_parallel_matches_single_device_training():
    env = dict(os.environ, PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "mlp_dp.py"), "--steps", "12"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert sum(line.startswith("step") for line in lines) == 12
    assert any(line.startswith("held-out accuracy") for line in lines)
    assert lines[-1].endswith(": OK"), lines[-1]


def test_train_and_serve_example_serves_the_live_weights_until_revoked():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_and_serve.py"),
                          "--steps", "12"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1].endswith(": OK") and "server saw: revoked" in lines[-1], out.stdout
    assert sum("served accuracy" in line for line in lines) == 3


def test_xla_overhead_bench_prints_its_json():
    # A smoke test of `pw bench xla-overhead --json` (its module, as the CLI runs it): the JSON's
    # fields and that pathways and JAX computed the same result. Not a timing.
    out = subprocess.run([sys.executable, "-m", "pathways.xla_overhead_bench", "--json",
                          "--sizes", "16", "--min-seconds", "0.2", "--rounds", "2", "--chain", "4"],
                         capture_output=True, text=True, timeout=300, check=True)
    import json
    result = json.loads(out.stdout)
    assert result["benchmark"] == "xla-overhead" and result["jax_backend"] == "same-plugin"
    (row,) = result["results"]
    assert row["results_agree"]
    assert row["pathways_per_second"] > 0 and row["jax_per_second"] > 0
    assert row["ratio"] == pytest.approx(row["pathways_per_second"] / row["jax_per_second"],
                                         rel=1e-2)
    assert len(row["ratio_by_round"]) == 2
    assert min(row["ratio_by_round"]) <= row["ratio_paired_median"] <= max(row["ratio_by_round"])


CHECK = ROOT / "python" / "tests" / "collectives_check.py"
REFERENCE_DEVICES = "--xla_force_host_platform_device_count=4"  # For the jax.pmap reference.


def run_check(*args, **env):
    env = dict(os.environ, XLA_FLAGS=REFERENCE_DEVICES, **env)
    env.pop("PW_CLUSTER", None)
    out = subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_every_collective_matches_jax_pmap_on_slices_spanning_hosts():
    # 1 island of 2 hosts x 2 devices: the 4-device slice spans both (in-process) hosts.
    out = run_check("collectives", "2", "4", PW_ISLANDS="1", PW_HOSTS_PER_ISLAND="2",
                    PW_DEVICES_PER_HOST="2")
    assert out.count("ok ") == 2 * 20


def test_collectives_over_one_axis_of_a_mesh_meet_in_groups_as_jax_shard_map():
    # pw.pmap over a (data 2, model 2) mesh spanning two in-process hosts: every collective over
    # "model", over "data" and over both (either order) matches JAX's shard_map on 4 CPU devices.
    out = run_check("mesh", PW_ISLANDS="1", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2")
    assert out.count("ok ") == 4 * 17 + 1


def test_a_mesh_axis_name_that_is_not_the_slices_is_refused():
    s = pw.make_virtual_device_set().add_slice(devices=4, mesh=(2, 2), axis_names=("d", "m"))
    f = pw.pmap(lambda x: x, devices=s, axis_name=("data", "model"))
    with pytest.raises(ValueError, match=r"axis_name \('data', 'model'\) must be the slice's mesh axes"):
        f(np.ones((4, 3), np.float32))


def test_overlapping_slices_never_deadlock():
    # The repro: psum chains on a 4-device slice and a 2-device slice of its devices,
    # from several threads and as asynchronous calls. XLA's own rendezvous hung here and ended
    # the process after 40 s; the runtime's collectives follow the island's gang order.
    shape = dict(PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="1", PW_DEVICES_PER_HOST="4")
    assert "ok overlap threads 100" in run_check("overlap", "threads", "100", **shape)
    assert "ok overlap async 100" in run_check("overlap", "async", "100", **shape)


def test_unsupported_collectives_fail_at_bind_time_saying_so():
    import jax
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: jax.lax.all_gather(x, "i", axis_index_groups=[[0], [1]]), devices=s,
                axis_name="i")
    with pytest.raises(ValueError, match="all_gather with axis_index_groups is not supported"):
        f(np.ones((2, 3), np.float32))


def test_placement_requests_and_where_a_slice_lies():
    ds = pw.make_virtual_device_set()  # The default embedded cluster: 2 islands x 1 host x 4.
    with ds.add_slice(devices=4) as s:
        assert len(s.islands) == 1 and len(set(s.hosts)) == 1 and len(s.devices) == 4
    on_host = ds.add_slice(devices=2, placement="host")
    assert len(set(on_host.hosts)) == 1
    spread = ds.add_slice(devices=8, placement="spread")
    assert spread.islands == [0, 1]
    with pytest.raises(RuntimeError, match="largest island has 4 alive devices"):
        ds.add_slice(devices=5)
    with pytest.raises(RuntimeError, match="largest host has 4 alive devices"):
        ds.add_slice(devices=5, placement="host")
    with pytest.raises(ValueError, match="placement must be 'island', 'host' or 'spread'"):
        ds.add_slice(devices=1, placement="rack")


def test_a_traced_value_kept_past_its_trace_is_refused_not_a_crash():
    # Issue 20, item 5: the Value held a pointer to a stack-local tracer.
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x * 2.0, devices=s)
    kept = []

    @pw.program
    def first(v):
        y = f(v)
        kept.append(y)
        return y

    first(np.ones(2, np.float32))

    @pw.program
    def second(v):
        return f(kept[0])

    with pytest.raises(RuntimeError, match="comes from another trace"):
        second(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="outside the @pw.program trace"):
        f(kept[0])
    np.testing.assert_array_equal(np.asarray(first(np.ones(2, np.float32))), [2.0, 2.0])


def test_arrays_outliving_the_interpreter_or_their_client_do_not_crash():
    # Issue 20, item 4: an Array referenced at exit held a raw pointer to its freed client.
    code = ("import numpy as np, pathways as pw\n"
            "s = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "f = pw.pmap(lambda x: x + 1.0, devices=s)\n"
            "KEPT = f(np.ones(2, np.float32))\n"
            "pw._conn = None  # As if connecting anew: the old client lives while KEPT does.\n"
            "t = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "g = pw.pmap(lambda x: x * 3.0, devices=t)\n"
            "print(np.asarray(KEPT).tolist(), np.asarray(g(np.ones(2, np.float32))).tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2.0, 2.0] [3.0, 3.0]"


def test_unsupported_dtypes_are_a_type_error_naming_them():
    import ml_dtypes
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x + 1, devices=s)
    for dtype in (np.complex128, ml_dtypes.float8_e4m3fn):
        with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype).name} is not supported"):
            f(np.ones(2, dtype))
        with pytest.raises(TypeError, match="supported: bfloat16, bool, complex64, float16"):
            pw.device_put(np.ones((2, 1), dtype), s)


# Issue 21 item 4: bfloat16 and complex64 raised TypeError (KeyError before that), and int16,
# uint16 and uint64 were not supported; read-only numpy arrays were refused by the binding.
def test_errors_are_typed_by_status_code():
    # Issue 20: every runtime error was a bare RuntimeError; they carry their status code now.
    ds = pw.make_virtual_device_set()
    with pytest.raises(pw.errors.ResourceExhausted, match="largest island has 4 alive devices") as e:
        ds.add_slice(devices=5)
    assert isinstance(e.value, pw.errors.Error) and isinstance(e.value, RuntimeError)
    assert e.value.code == "RESOURCE_EXHAUSTED" and "largest island" in e.value.message
    s = ds.add_slice(devices=2)
    s.release()
    with pytest.raises(pw.errors.NotFound, match="not a slice of this client"):
        s.release()
    f = pw.pmap(lambda x: x * 2.0, devices=ds.add_slice(devices=2))
    prog = pw.program(lambda v: f(v))
    traced = prog._trace(*prog._leaves((np.ones((2, 3), np.float32),)))[0]
    with pytest.raises(pw.errors.InvalidArgument, match=r"argument 0 expects f32\[2,3\]"):
        traced.put_arg(0, *pw._layout.raw(np.ones((2, 4), np.float32)))


def test_timeouts_must_be_positive():
    f = pw.pmap(lambda x: x + 1.0, devices=pw.make_virtual_device_set().add_slice(devices=2))
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        f(np.zeros(2, np.float32), timeout=-1)
    np.testing.assert_array_equal(np.asarray(f(np.zeros(2, np.float32), timeout=60.0)), [1, 1])


def _run_traced(tmp_path, trace_arg, env_extra, runs=3):
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("traced_two_islands.py")
    info = tmp_path / "info.json"
    env = dict(os.environ, PW_ISLANDS="2", PW_HOSTS_PER_ISLAND="2", PW_DEVICES_PER_HOST="2",
               **env_extra)
    env.pop("PW_CLUSTER", None)
    r = subprocess.run([sys.executable, str(script), trace_arg, str(info), str(runs), "4"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(info.read_text()), r


def test_pw_trace_records_every_stage_of_an_embedded_two_island_program(tmp_path):
    # Issue 22 item 1: the client's call, the controller's submit, each island's scheduling
    # decision, each host's dispatch, each device's computation (a psum inside), the transfers
    # over DCN with their bytes, linked by flows, in gang order on every device.
    from trace_checks import check_runs
    info, _ = _run_traced(tmp_path, str(tmp_path / "t.json"), {})
    islands = {int(k): v for k, v in info["islands"].items()}
    t = check_runs(tmp_path / "t.json", devices=islands[0] + islands[1], runs_per_device=3,
                   transfer_bytes=info["shard_bytes"], islands=islands)
    assert len(t.of("collective")) >= 3 * len(islands[0])  # The psum, on island 0's devices.


def test_PW_TRACE_traces_an_embedded_clusters_whole_life(tmp_path):
    from trace_checks import check_runs
    info, r = _run_traced(tmp_path, "-", {"PW_TRACE": str(tmp_path / "life.json")})
    assert "(PW_TRACE)" in r.stderr
    islands = {int(k): v for k, v in info["islands"].items()}
    check_runs(tmp_path / "life.json", devices=islands[0] + islands[1], runs_per_device=3,
               transfer_bytes=info["shard_bytes"], islands=islands)
