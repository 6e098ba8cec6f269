"""A local multi-process cluster (`pw up`): the CLI, the Python client over gRPC, and a worker
killed with SIGKILL that rejoins. Each test starts and stops its own cluster on loopback."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos import alive, pw  # python/tests is on sys.path under pytest (rootdir-relative)

ROOT = Path(__file__).resolve().parents[2]
PW = ROOT / "build" / "bin" / "pw"
FIGURE2 = "(array([3., 5.]), array([2., 4.]))"

pytestmark = pytest.mark.skipif(not PW.exists(), reason="build/bin/pw is not built (make build)")


@pytest.fixture
def cluster(tmp_path):
    env = dict(os.environ, PW_STATE_DIR=str(tmp_path))
    env.pop("PW_CLUSTER", None)
    # A long heartbeat timeout: a stall of this loaded machine must not fail a healthy worker (a
    # killed one is failed at once by its broken command stream).
    address = pw("up", "--detach", "--islands", "2", "--hosts-per-island", "2",
                 "--devices-per-host", "2", "--failure-timeout-ms", "60000",
                 env=env).stdout.strip().splitlines()[-1]
    state = json.loads((tmp_path / "cluster.json").read_text())
    try:
        yield env, address, state
    finally:
        pw("down", env=env, check=False)
        for pid in [state["controller_pid"], *state["worker_pids"]]:
            t0 = time.monotonic()  # A killed process may take a moment to be reaped.
            while alive(pid) and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            assert not alive(pid), f"process {pid} still running after pw down"


def status(env):
    return json.loads(pw("status", "--json", env=env).stdout)


def test_up_status_figure2_down(cluster):
    env, address, state = cluster
    assert address.startswith("127.0.0.1:")
    s = status(env)
    assert [h["alive"] for h in s["hosts"]] == [True] * 4
    assert sum(len(h["devices"]) for h in s["hosts"]) == 8
    # Without --cluster, client commands use the cluster pw up started.
    r = pw("example", "figure2", env=env)
    assert r.stdout.strip() == FIGURE2
    assert "using the cluster at " + address in r.stderr
    r = pw("example", "figure2", "--cluster", address, env=env)
    assert r.stdout.strip() == FIGURE2
    s = status(env)
    assert s["dcn_bytes_received"] > 0  # Figure 2 moves values between the islands.
    t0 = time.monotonic()  # The clients have gone; their buffers are freed as they disconnect.
    while s["logical_buffers"] != 0 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
        s = status(env)
    assert s["logical_buffers"] == 0
    # The admin's cancel (the cluster token from pw up's state): nothing runs now.
    r = pw("cancel", "999", env=env, check=False)
    assert r.returncode == 1 and "run:999 is not in flight" in r.stderr, r.stderr
    assert "cancelled 0 runs" in pw("cancel", "--client", "0", env=env).stderr


def test_python_client_on_the_cluster(cluster):
    env, address, _ = cluster
    # The paper's Figure 2 in JAX, on the cluster (PW_CLUSTER), and through pw.connect.
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "figure2.py")],
                       env=dict(env, PW_CLUSTER=address), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == FIGURE2
    code = ("import numpy as np, pathways as pw\n"
            f"print(pw.connect('{address}'))\n"
            "s = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "f = pw.pmap(lambda x: x * 3.0, devices=s)\n"
            "print(np.asarray(f(np.array([1., 2.], np.float32))).tolist())\n"
            # Issue 21 item 4: every dtype crosses the wire; a jax.Array in bfloat16 runs.
            "import ml_dtypes, jax.numpy as jnp\n"
            "for dt in (ml_dtypes.bfloat16, np.int16, np.uint64, np.complex64, np.bool_):\n"
            "    x = (np.arange(4).reshape(2, 2) % 3).astype(dt)\n"
            "    back = np.asarray(pw.device_put(x, s))\n"
            "    assert back.dtype == x.dtype and (back == x).all(), dt\n"
            "g = pw.pmap(lambda v: v * 2, devices=s)\n"
            "print(np.asarray(g(jnp.ones((2, 2), jnp.bfloat16))).astype(np.float32).tolist())\n"
            # Arrays of 1 MiB or more go from the numpy array's own memory to the workers: by
            # rows, by columns (cut), replicated, read-only, Fortran-ordered; the put has ended
            # with the call, so a later write to the numpy array changes nothing on the devices.
            "from jax.sharding import PartitionSpec as P\n"
            "big = np.random.default_rng(0).standard_normal((2, 1 << 18)).astype(np.float32)\n"
            "ro = big.copy(); ro.flags.writeable = False\n"
            "for x, spec in ((big, None), (big, P(None, s.axis_names[0])), (big, P()),\n"
            "                (ro, None), (np.asfortranarray(big), None)):\n"
            "    a = pw.device_put(x, s, sharding=spec)\n"
            "    keep = x.copy()\n"
            "    if x.flags.writeable: x[...] = 0\n"
            "    assert np.array_equal(np.asarray(a), keep), spec\n"
            "    big[...] = keep\n"
            "print('large puts ok')\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [address, "[3.0, 6.0]", "[[2.0, 2.0], [2.0, 2.0]]",
                                             "large puts ok"]


def test_killed_worker_leaves_and_rejoins(cluster):
    env, address, state = cluster
    victim = state["worker_pids"][1]  # host 1 (island 0).
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        hosts = status(env)["hosts"]
        if not hosts[1]["alive"]:
            break
        time.sleep(0.05)
    detected = time.monotonic() - t0
    print(f"worker kill detected by the controller after {detected:.2f}s")
    assert not hosts[1]["alive"], hosts[1]
    print(f"reason: {hosts[1].get('reason')}")
    assert hosts[1].get("reason"), hosts[1]
    # Programs that don't need it keep running (Figure 2's slices fit on the others).
    assert pw("example", "figure2", env=env).stdout.strip() == FIGURE2
    # A restarted worker rejoins.
    log = open(Path(env["PW_STATE_DIR"]) / "worker-1-restarted.log", "w")
    # Workers present the cluster's own token, which `pw up` keeps in its (owner-only) state.
    worker_env = dict(env, PW_CLUSTER_TOKEN=state["cluster_token"])
    new = subprocess.Popen([str(PW), "worker", "--controller", address, "--host", "1"],
                           stdout=log, stderr=log, start_new_session=True, env=worker_env)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and not status(env)["hosts"][1]["alive"]:
            time.sleep(0.05)
        assert status(env)["hosts"][1]["alive"]
        assert pw("example", "figure2", env=env).stdout.strip() == FIGURE2
    finally:
        new.terminate()
        new.wait(timeout=30)


def test_restart_workers_brings_a_killed_worker_back_and_pw_down_stops_it(tmp_path):
    # pw up --restart-workers: a supervisor process restarts a killed worker, which rejoins as
    # its host (a psum over both hosts of the island runs again); pw down stops the supervisor
    # first, then every worker, the restarted one included.
    env = dict(os.environ, PW_STATE_DIR=str(tmp_path))
    env.pop("PW_CLUSTER", None)
    address = pw("up", "--detach", "--restart-workers", "--islands", "1", "--hosts-per-island",
                 "2", "--devices-per-host", "2", "--failure-timeout-ms", "60000",
                 env=env).stdout.strip().splitlines()[-1]
    state = json.loads((tmp_path / "cluster.json").read_text())
    victim = now = state["worker_pids"][1]
    try:
        assert alive(state["supervisor_pid"])
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            now = json.loads((tmp_path / "cluster.json").read_text())["worker_pids"][1]
            if now != victim and status(env)["hosts"][1]["alive"]:
                break
            time.sleep(0.05)
        print(f"worker restarted and rejoined after {time.monotonic() - t0:.2f}s")
        assert now != victim and alive(now) and status(env)["hosts"][1]["alive"]
        assert f"restarted as pid {now}" in (tmp_path / "supervisor.log").read_text()
        code = ("import numpy as np, jax, pathways as pw\n"
                "s = pw.make_virtual_device_set().add_slice(devices=4)\n"
                "f = pw.pmap(lambda x: jax.lax.psum(x, 'i'), devices=s, axis_name='i')\n"
                "print(np.asarray(f(np.arange(4, dtype=np.float32))).tolist())\n")
        r = subprocess.run([sys.executable, "-c", code], env=dict(env, PW_CLUSTER=address),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[6.0, 6.0, 6.0, 6.0]"
    finally:
        pw("down", env=env, check=False)
    pids = [state["supervisor_pid"], state["controller_pid"], now, *state["worker_pids"]]
    t0 = time.monotonic()
    while any(alive(p) for p in pids) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), [p for p in pids if alive(p)]


CHECK = ROOT / "python" / "tests" / "collectives_check.py"


def check(address, *args, env):
    return subprocess.Popen([sys.executable, str(CHECK), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(env, PW_CLUSTER=address,
                                     XLA_FLAGS="--xla_force_host_platform_device_count=4"))


def finish(p, timeout=600):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, out + err
    return out


def test_collectives_span_worker_processes(cluster):
    env, address, _ = cluster
    # On 2 hosts x 2 devices per island, a 4-device slice spans both worker processes.
    out = finish(check(address, "collectives", "2", "4", env=env))
    assert out.count("ok ") == 2 * 20


def test_collectives_over_one_axis_of_a_mesh_meet_in_groups_across_processes(cluster):
    env, address, _ = cluster
    # A (data 2, model 2) mesh over 4 devices of 2 worker processes: every collective over one
    # axis, the other and both matches JAX's shard_map.
    out = finish(check(address, "mesh", env=env))
    assert out.count("ok ") == 4 * 17 + 1


def test_overlapping_slices_from_two_clients_and_async_calls_never_deadlock(cluster):
    env, address, _ = cluster
    clients = [check(address, "overlap", "single", "100", "4", env=env),
               check(address, "overlap", "single", "100", "2", env=env)]
    for c in clients:
        assert "ok overlap single 100" in finish(c)
    assert "ok overlap async 100" in finish(check(address, "overlap", "async", "100", env=env))
    assert "ok overlap threads 100" in finish(check(address, "overlap", "threads", "100", env=env))


def test_checkpoints_on_pw_up_are_written_by_workers_and_a_lost_worker_leaves_no_partial_one(
        cluster):
    # pw.checkpoint on the README's pw up shape: paths within the cluster's checkpoint root
    # (<state dir>/checkpoints); the workers of island 0 write, stock tensorstore reads, island 1
    # restores. Then host 1 is killed and a save of an array it holds part of fails naming it:
    # the earlier checkpoint is intact and nothing of the failed one is visible.
    env, address, state = cluster
    root = os.path.join(env["PW_STATE_DIR"], "checkpoints")
    code = textwrap.dedent("""
        import sys, numpy as np, tensorstore as ts, pathways as pw
        ds = pw.make_virtual_device_set()
        s0 = ds.add_slice(devices=4, island=0)  # Hosts 0 and 1.
        s1 = ds.add_slice(devices=2, island=1)
        w = np.arange(32, dtype=np.float32).reshape(8, 4)
        tree = {"w": pw.device_put(w, s0), "b": pw.device_put(w[0] * 2, s0)}
        path = pw.checkpoint.save(tree, "run/step1").wait()
        print(path, flush=True)
        got = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": path + "/w"}})
        assert (got.result().read().result() == w).all()
        like = {"w": pw.device_put(np.zeros_like(w), s1),
                "b": pw.device_put(np.zeros(4, np.float32), s1)}
        back = pw.checkpoint.restore("run/step1", like)
        assert (np.asarray(back["w"]) == w).all() and (np.asarray(back["b"]) == w[0] * 2).all()
        print("restored", flush=True)
        sys.stdin.readline()  # The test kills host 1's worker now.
        try:
            pw.checkpoint.save(tree, "run/step2").wait()
            print("saved")
        except pw.errors.Error as e:
            print("failed:", str(e).splitlines()[0])
        back = pw.checkpoint.restore("run/step1", like)
        print("intact", (np.asarray(back["w"]) == w).all(), flush=True)
        try:
            pw.checkpoint.save(tree, "/etc/x").wait()
        except pw.errors.InvalidArgument as e:
            print("refused:", e)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(env, PW_CLUSTER=address))
    assert p.stdout.readline().strip() == os.path.join(root, "run", "step1")
    assert p.stdout.readline().strip() == "restored"
    assert sorted(os.listdir(os.path.join(root, "run", "step1", "w"))) == [
        ".zarray", "0.0", "1.0", "2.0", "3.0"]
    os.kill(state["worker_pids"][1], signal.SIGKILL)
    p.stdin.write("\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("failed:") and "host:1" in lines[0], out
    assert lines[1] == "intact True", out
    assert "is not within the cluster's checkpoint root" in lines[2], out
    assert sorted(os.listdir(os.path.join(root, "run")))[0] == "step1"
    assert not os.path.exists(os.path.join(root, "run", "step2"))


def test_a_collective_whose_peer_process_is_killed_fails_naming_the_host(cluster):
    env, address, state = cluster
    code = (
        "import sys, time, numpy as np, jax, pathways as pw\n"
        "ds = pw.make_virtual_device_set()\n"
        "s = ds.add_slice(devices=4)\n"
        "print('hosts', s, flush=True)\n"
        "f = pw.pmap(lambda x: jax.lax.psum(x, 'i'), devices=s, axis_name='i')\n"
        "x = np.ones((4, 1000), np.float32)\n"
        "np.asarray(f(x)); print('ready', flush=True)\n"
        "sys.stdin.readline()\n"  # The test kills a worker of the slice now.
        "t0 = time.monotonic()\n"
        "try:\n"
        "    for _ in range(1000): np.asarray(f(x))\n"
        "    print('no error')\n"
        "except Exception as e:\n"
        "    print('error after %.2fs: %s' % (time.monotonic() - t0, e))\n"
        "g = pw.pmap(lambda x: jax.lax.psum(x, 'i'), devices=ds.add_slice(devices=2), axis_name='i')\n"
        "print('next', np.asarray(g(np.ones((2, 3), np.float32))).tolist(), flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(env, PW_CLUSTER=address))
    assert p.stdout.readline().startswith("hosts")
    assert p.stdout.readline().strip() == "ready"
    os.kill(state["worker_pids"][1], signal.SIGKILL)  # Host 1 holds half of the slice.
    p.stdin.write("\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    lines = out.splitlines()
    print(lines[0])
    assert lines[0].startswith("error after"), out
    assert "host:1" in lines[0], lines[0]
    assert float(lines[0].split()[2].rstrip("s:")) < 30  # Well within the failure timeout.
    assert lines[1] == "next [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]", out


def test_placement_on_the_cluster(cluster):
    env, address, _ = cluster
    code = ("import pathways as pw\n"
            "ds = pw.make_virtual_device_set()\n"
            "print(ds.add_slice(devices=4).hosts)\n"
            "print(ds.add_slice(devices=2, placement='host').hosts)\n"
            "print(ds.add_slice(devices=8, placement='spread').islands)\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PW_CLUSTER=address),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    one_island, one_host, both = r.stdout.splitlines()
    assert sorted(set(eval(one_island))) in ([0, 1], [2, 3])  # Both hosts of one island.
    assert len(set(eval(one_host))) == 1
    assert eval(both) == [0, 1]


def test_jax_api_on_the_cluster(cluster):
    # Issue 21: test_jax_api.py again, its slices spanning worker processes; the workers' logs
    # hold none of XLA's warnings about how modules were exported.
    env, address, state = cluster
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "python" / "tests" / "test_jax_api.py")],
                       env=dict(env, PW_CLUSTER=address), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+) passed, 1 skipped", r.stdout)  # Only the embedded-only test skips.
    assert passed and int(passed.group(1)) >= 12, r.stdout[-2000:]
    logs = list(Path(env["PW_STATE_DIR"]).rglob("*.log"))
    assert logs, list(Path(env["PW_STATE_DIR"]).iterdir())
    for log in logs:
        text = log.read_text(errors="replace")
        assert "shardy" not in text and "W0000" not in text, (log, text[-2000:])


def test_arrays_shared_between_processes_outlive_their_owner_and_train_and_serve(cluster):
    # Issue 21 item 7: the owner's process shares an array and exits; the importer's handle keeps
    # the buffer, and the token dies with its owner. Then the example: a trainer process and a
    # server process on one cluster, the server predicting from the live weights until revoked.
    env, address, _ = cluster
    env = dict(env, PW_CLUSTER=address)
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, numpy as np, pathways as pw\n"
         "s = pw.make_virtual_device_set().add_slice(devices=2)\n"
         "a = pw.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), s)\n"
         "print(a.share(), flush=True)\n"
         "sys.stdin.readline()\n"],  # Exits (disconnecting) once told.
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    token = owner.stdout.readline().strip()
    importer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, numpy as np, pathways as pw\n"
         "a = pw.Array.from_shared(sys.argv[1])\n"
         "print(np.asarray(a).tolist(), flush=True)\n"
         "sys.stdin.readline()\n"  # The owner has exited now.
         "f = pw.pmap(lambda x: x + 1, devices=pw.make_virtual_device_set().add_slice(devices=2))\n"
         "print(np.asarray(f(a)).tolist(), flush=True)\n"
         "try:\n"
         "    pw.Array.from_shared(sys.argv[1])\n"
         "except pw.errors.NotFound as e:\n"
         "    print('gone', flush=True)\n", token],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert importer.stdout.readline().strip() == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"
    owner.stdin.write("\n")
    owner.stdin.flush()
    assert owner.wait(timeout=120) == 0
    t0 = time.monotonic()  # The controller sees the owner's channel close.
    while status(env)["clients"] > 1 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    importer.stdin.write("\n")
    importer.stdin.flush()
    out, _ = importer.communicate(timeout=120)
    assert importer.returncode == 0
    assert out.split("\n")[:2] == ["[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]", "gone"], out
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_and_serve.py"), "--steps",
                        "12"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith(": OK"), r.stdout


def scrape(address):
    """A /metrics page as {(name, labels): value}."""
    import urllib.request
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def total(samples, name, labels=None):
    return sum(v for (n, l), v in samples.items() if n == name and (labels is None or l == labels))


def test_metrics_endpoints_count_what_the_load_ran(cluster):
    # Issue 22 item 2: pw up gives every process a Prometheus endpoint, pw status --json lists
    # them, and their counters move as the load implies: 20 runs of a 3-node program on 2
    # devices are 20 OK runs at the controller and 3 x 2 x 20 computations over the workers.
    env, address, _ = cluster
    st = status(env)
    controller = st["metrics_address"]
    workers = [h["metrics_address"] for h in st["hosts"]]
    assert controller.startswith("127.0.0.1:") and len(workers) == 4 and all(workers)
    before = [scrape(controller)] + [scrape(w) for w in workers]
    code = ("import numpy as np, pathways as pw\n"
            "s = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "f = pw.pmap(lambda x: x * 2, devices=s)\n"
            "g = pw.pmap(lambda x: x + 1, devices=s)\n"
            "p = pw.program(lambda v: g(f(g(v))))\n"
            "for _ in range(20):\n"
            "    p(np.ones((2, 3), np.float32)).block_until_ready()\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PW_CLUSTER=address),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    after = [scrape(controller)] + [scrape(w) for w in workers]
    runs = total(after[0], "pw_runs_total", '{code="OK"}') - total(before[0], "pw_runs_total", '{code="OK"}')
    assert runs == 20
    assert total(after[0], "pw_run_duration_seconds_count") - \
        total(before[0], "pw_run_duration_seconds_count") == 20
    assert total(after[0], "pw_runs_completed_total") - total(before[0], "pw_runs_completed_total") == 20
    computations = sum(total(a, "pw_device_computations_total") - total(b, "pw_device_computations_total")
                       for a, b in zip(after[1:], before[1:]))
    assert computations == 3 * 2 * 20
    assert all(total(a, "pw_device_up") == 2 for a in after[1:])  # Two devices per host, in service.
    assert total(after[0], "pw_run_dispatch_seconds_count") - \
        total(before[0], "pw_run_dispatch_seconds_count") == 20  # Every run's dispatch overhead.
    delta = lambda name: sum(total(a, name) - total(b, name) for a, b in zip(after[1:], before[1:]))
    assert delta("pw_device_busy_seconds_total") > 0
    assert delta("pw_client_device_seconds_total") > 0  # The one tenant's share: all of it.
    assert delta("pw_host_compiles_total") >= 2  # Two per-shard XLA functions, where bound.
    assert delta("pw_host_compile_seconds_total") > 0
    assert all(total(a, "pw_device_memory_capacity_bytes") > 0 for a in after[1:])


def test_collectives_bench_prints_its_json():
    # A smoke test of `pw bench collectives --json` (it starts its own local clusters): the
    # contract's fields, both algorithms, and sizes on both sides of the scatter threshold.
    r = subprocess.run([str(PW), "bench", "collectives", "--processes", "3", "--sizes",
                        "8,1048576", "--min-seconds", "0.02", "--baseline", "--json"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PW_STATE_DIR="/nonexistent-not-used"))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert {(x["algorithm"], x["bytes"]) for x in rows} == {
        (a, b) for a in ("auto", "broadcast") for b in (8, 1048576)}
    for x in rows:
        assert x["processes"] == 3 and x["seconds"] > 0
        assert x["bus_gbps"] == pytest.approx(x["bytes"] * 2 * 2 / 3 / x["seconds"] / 1e9)
        assert x["memcpy_gbps"] > 0 and x["tcp_gbps"] > 0


def test_mpmd_bench_prints_its_json():
    # A smoke test of `pw bench mpmd --json` (it starts and stops its own `pw up` cluster): the
    # contract's fields, every side and mode, each side's result checked against numpy's by
    # the bench itself (it exits non-zero otherwise), and no process left behind. Not a timing.
    def workers():
        return subprocess.run(["pgrep", "-f", "pw worker"], capture_output=True, text=True).stdout.split()

    before = workers()
    env = {k: v for k, v in os.environ.items() if k != "PW_CLUSTER"}
    r = subprocess.run([str(PW), "bench", "mpmd", "--json", "--min-seconds", "0.2", "--rounds", "1",
                        "--batch", "4"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["benchmark"] == "mpmd" and out["shape"] == [2, 2, 2] and out["stages"] == 3
    assert {(x["side"], x["mode"]) for x in out["results"]} == {
        (s, m) for s in ("embedded", "cluster", "jax") for m in ("sync", "async")}
    assert all(x["calls_per_second"] > 0 and len(x["round_rates"]) == 1 for x in out["results"])
    for side in ("embedded", "cluster"):  # Stages 1 and 3 on one island, 2 on the other.
        islands = [s["islands"] for s in out["placement"][side]]
        assert islands[0] == islands[2] != islands[1] and all(len(i) == 1 for i in islands)
    rate = {(x["side"], x["mode"]): x["calls_per_second"] for x in out["results"]}
    assert out["summary"]["cluster_over_embedded_async"] == pytest.approx(
        rate[("cluster", "async")] / rate[("embedded", "async")], rel=1e-2)
    assert {"embedded_over_jax_sync", "cluster_async_over_sync"} <= out["summary"].keys()
    assert workers() == before, "the bench's cluster is still running"


def test_multitenant_bench_prints_its_json(cluster):
    # A smoke test of `pw bench multitenant --json` on the README's `pw up` shape (island 0: 4
    # devices in 2 worker processes): the contract's fields; two client processes at shares 1:3,
    # the second joining late, and the one with the larger share getting the more device time.
    # Not a timing.
    env, address, _ = cluster
    r = subprocess.run([str(PW), "bench", "multitenant", "--cluster", address, "--json",
                        "--clients", "2", "--shares", "1,3", "--compute-ms", "0.5", "--seconds",
                        "2", "--late-join", "--in-flight", "8"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    [res] = out["results"]
    assert res["clients"] == 2 and res["compute_ms"] == 0.5
    assert res["aggregate_per_second"] > 0 and res["single_client_per_second"] > 0
    # The baseline: one client alone just before and just after the two, their mean.
    assert res["single_client_per_second"] == pytest.approx(
        (res["single_client_per_second_before"] + res["single_client_per_second_after"]) / 2)
    assert res["utilization"] == pytest.approx(res["aggregate_per_second"] * 0.5 / 1000)
    # Measured from the cluster's account of the clients' device time (not implied by calls/s).
    assert 0 < res["device_busy"] <= 1.5, res
    assert 0 < res["single_device_busy"] <= 1.5, res
    shares = res["shares"]
    assert [s["configured"] for s in shares] == pytest.approx([0.25, 0.75])
    assert sum(s["achieved"] for s in shares) == pytest.approx(1.0)
    assert shares[1]["achieved"] > shares[0]["achieved"], shares
    assert all(s["calls"] > 0 and 0 <= s["worst_window"] <= 1 for s in shares)
    assert res["late_join"]["joined_at_seconds"] == pytest.approx(1.0)
    status = json.loads(pw("status", "--json", env=env).stdout)
    assert status["scheduling"] == "share"
    assert not [t for t in status["tenants"] if t["tenant"].startswith("t")], "tenants left"


def test_io_bench_prints_its_json(cluster):
    # A smoke test of `pw bench io --json` on the README's `pw up` shape: the contract's fields,
    # a small array (through the controller) and a large one (beside it: the workers' bulk
    # streams). The bench checks what comes back is what went. Not a timing.
    env, address, _ = cluster
    r = subprocess.run([str(PW), "bench", "io", "--cluster", address, "--json", "--sizes",
                        "1024,2097152", "--min-seconds", "0.05"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(x["op"], x["bytes"]) for x in out["results"]] == [
        ("put", 1024), ("get", 1024), ("put", 2097152), ("get", 2097152)]
    for x in out["results"]:
        assert x["gbps"] > 0 and x["raw_tcp_gbps"] > 0
        assert x["ratio"] == pytest.approx(x["gbps"] / x["raw_tcp_gbps"], rel=1e-3)
        assert 0 <= x["controller_rss_growth_bytes"] < 64 << 20


def test_large_psum_over_four_processes_reduce_scatters(tmp_path):
    # 4 worker processes in one island: a psum of 1 MiB per shard takes the reduce-scatter +
    # all-gather path between the processes (pw/executor/collectives.h) from an XLA function.
    env = dict(os.environ, PW_STATE_DIR=str(tmp_path))
    env.pop("PW_CLUSTER", None)
    address = pw("up", "--detach", "--islands", "1", "--hosts-per-island", "4",
                 "--devices-per-host", "1", "--failure-timeout-ms", "60000",
                 env=env).stdout.strip().splitlines()[-1]
    try:
        code = ("import numpy as np, jax, pathways as pw\n"
                "s = pw.make_virtual_device_set().add_slice(devices=4)\n"
                "assert sorted(s.hosts) == [0, 1, 2, 3], s\n"
                "f = pw.pmap(lambda x: jax.lax.psum(x, 'i') - jax.lax.pmax(x, 'i'), devices=s,"
                " axis_name='i')\n"
                "x = np.random.default_rng(0).standard_normal((4, 1 << 18)).astype(np.float32)\n"
                "want = x.sum(0) - x.max(0)\n"
                "got = np.asarray(f(x))\n"
                "np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-5,"
                " atol=1e-5)\n"
                "print('ok')\n")
        r = subprocess.run([sys.executable, "-c", code], env=dict(env, PW_CLUSTER=address),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "ok"
    finally:
        pw("down", env=env, check=False)


def test_xla_overhead_bench_across_processes(cluster):
    env, address, _ = cluster
    r = pw("bench", "xla-overhead", "--cluster", address, "--json", "--min-seconds", "0.1",
           "--rounds", "1", "--chain", "4", env=env, timeout=300)
    out = json.loads(r.stdout)
    two, one = out["results"]
    assert two["slice"] == "two_processes" and len(set(two["hosts"])) == 2
    assert one["slice"] == "one_process" and len(set(one["hosts"])) == 1
    assert two["us_per_node"] > 0 and one["us_per_node"] > 0
    assert out["ratio_two_over_one"] == pytest.approx(two["us_per_node"] / one["us_per_node"],
                                                      rel=1e-2)


def test_connecting_twice_and_dropping_the_first_connections_arrays(cluster):
    env, address, _ = cluster
    code = ("import gc, numpy as np, pathways as pw\n"
            f"pw.connect('{address}')\n"
            "s = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "a = pw.device_put(np.ones((2, 3), np.float32), s)\n"
            "b = pw.device_put(np.ones((2, 3), np.float32), s)\n"
            f"pw.connect('{address}')\n"
            "del a; gc.collect()  # Released through the first client, which is still alive.\n"
            "t = pw.make_virtual_device_set().add_slice(devices=2)\n"
            "f = pw.pmap(lambda x: x * 2.0, devices=t)\n"
            "print(np.asarray(f(np.ones((2, 3), np.float32))).sum(), np.asarray(b).sum())\n"
            "KEEP = b  # Referenced at exit.\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["12.0", "6.0"]


def test_state_directory_and_logs_are_owner_only_and_logs_never_follow_links(tmp_path):
    # Issue 20, item 10: the state directory was 0755 and logs were opened through links.
    state = tmp_path / "state"  # Made by pw up.
    env = dict(os.environ, PW_STATE_DIR=str(state))
    env.pop("PW_CLUSTER", None)
    state.parent.mkdir(exist_ok=True)
    pw("up", "--detach", "--islands", "1", "--hosts-per-island", "1", "--devices-per-host", "1",
       env=env)
    try:
        assert (state.stat().st_mode & 0o777) == 0o700
        assert (state / "controller.log").stat().st_mode & 0o077 == 0
    finally:
        pw("down", env=env, check=False)
    # A log that is a link (say, to a file of another user's) is not written through.
    target = tmp_path / "not-a-log"
    target.write_text("")
    (state / "worker-0.log").unlink()
    (state / "worker-0.log").symlink_to(target)
    pw("up", "--detach", "--islands", "1", "--hosts-per-island", "1", "--devices-per-host", "1",
       env=env, check=False)
    pw("down", env=env, check=False)
    assert target.read_text() == ""


RUNAWAY = """
import sys, time, numpy as np, jax, jax.numpy as jnp, pathways as pw
pw.connect(sys.argv[1])
s = pw.make_virtual_device_set().add_slice(devices=2)
# Never ends: c saturates at 2**24 and stays below infinity.
forever = pw.pmap(lambda x: jax.lax.while_loop(lambda c: c < jnp.inf, lambda c: c + 1.0, x),
                  devices=s)
y = forever(np.zeros(2, np.float32), timeout=1.0)
t0 = time.monotonic()
try:
    np.asarray(y)
    print("finished?!")
except pw.errors.DeadlineExceeded as e:
    print(f"deadline after {time.monotonic() - t0:.1f}s: {e}", flush=True)
# The devices serve the next program once the worker has restarted (a bounded delay).
inc = pw.pmap(lambda x: x + 1.0, devices=s)
t0 = time.monotonic()
while True:
    try:
        print("next:", np.asarray(inc(np.zeros(2, np.float32))).tolist(),
              f"after {time.monotonic() - t0:.1f}s", flush=True)
        break
    except pw.errors.Error as e:
        if time.monotonic() - t0 > 60:
            raise
        time.sleep(0.2)
"""


# Issue 20 item 7: an endless lax.while_loop kept its devices busy for every later program, from
# any client, until someone killed the workers. Its run times out; the worker whose device still
# runs it restarts in place (same pid) and rejoins; the next program runs.
def test_a_runaway_computation_times_out_and_its_worker_restarts_in_place(tmp_path):
    env = dict(os.environ, PW_STATE_DIR=str(tmp_path))
    env.pop("PW_CLUSTER", None)
    address = pw("up", "--detach", "--islands", "1", "--hosts-per-island", "2",
                 "--devices-per-host", "1", "--failure-timeout-ms", "60000",
                 "--overrun-grace-ms", "1000", env=env).stdout.strip().splitlines()[-1]
    state = json.loads((tmp_path / "cluster.json").read_text())
    try:
        r = subprocess.run([sys.executable, "-c", RUNAWAY, address], env=env,
                           capture_output=True, text=True, timeout=300)
        print(r.stdout)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("deadline after "), lines
        assert "overran its timeout of 1s and was cancelled" in lines[0], lines
        assert lines[1].startswith("next: [1.0, 1.0]"), lines
        logs = "".join((tmp_path / f"worker-{h}.log").read_text() for h in (0, 1))
        assert "after it was cancelled" in logs and "this worker restarts" in logs, logs
        # In place: the same processes, all alive and serving.
        assert all(alive(p) for p in state["worker_pids"])
        assert [h["alive"] for h in status(env)["hosts"]] == [True, True]
    finally:
        pw("down", env=env, check=False)


# A worker that does not stop on SIGTERM (here: stopped) is killed by pw down, which then removes
# the shared-memory segments it left (seen failing first: its pw-mbox-<pid>-* mailbox stayed).
def test_pw_down_removes_the_segments_of_workers_it_had_to_kill(tmp_path):
    env = dict(os.environ, PW_STATE_DIR=str(tmp_path))
    env.pop("PW_CLUSTER", None)
    pw("up", "--detach", "--islands", "1", "--hosts-per-island", "1", "--devices-per-host", "1",
       "--failure-timeout-ms", "60000", env=env)
    worker = json.loads((tmp_path / "cluster.json").read_text())["worker_pids"][0]
    def segments():
        return [n for n in os.listdir("/dev/shm") if n.startswith(f"pw-mbox-{worker}-")]
    assert segments(), "the worker made no mailbox"
    os.kill(worker, signal.SIGSTOP)
    r = pw("down", env=env, check=False, timeout=60)
    assert "killed processes" in r.stderr, r.stderr
    assert segments() == []


TLS_CLIENT = """
import sys, numpy as np, pathways as pw
pw.connect(sys.argv[1])
s = pw.make_virtual_device_set().add_slice(devices=2)
f = pw.pmap(lambda x: jax.lax.psum(x, "i"), devices=s, axis_name="i")
print(np.asarray(f(np.array([1., 2.], np.float32))).tolist())
""".replace("import sys,", "import sys, jax,")


# Issue 20 (TLS): a pw up cluster on TLS. Python clients with PW_TLS_CA run (a psum across the
# worker processes); one without it is refused with an error saying what to set; pw status and
# pw down use pw up's certificates; listening off loopback in plaintext needs --insecure.
def test_a_cluster_on_tls(tmp_path):
    certs = tmp_path / "tls"
    subprocess.run([str(ROOT / "scripts" / "tls-certs.sh"), str(certs)], check=True)
    state_dir = tmp_path / "state"
    env = dict(os.environ, PW_STATE_DIR=str(state_dir))
    for k in ("PW_CLUSTER", "PW_TLS_CA", "PW_TLS_CERT", "PW_TLS_KEY"):
        env.pop(k, None)
    tls = ["--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem"),
           "--tls-ca", str(certs / "ca.pem")]
    address = pw("up", "--detach", "--islands", "1", "--hosts-per-island", "2",
                 "--devices-per-host", "1", "--failure-timeout-ms", "60000", *tls,
                 env=env).stdout.strip().splitlines()[-1]
    try:
        assert [h["alive"] for h in status(env)["hosts"]] == [True, True]
        r = subprocess.run([sys.executable, "-c", TLS_CLIENT, address],
                           env=dict(env, PW_TLS_CA=str(certs / "ca.pem")),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["[3.0,", "3.0]"], r.stdout
        plain = subprocess.run([sys.executable, "-c", TLS_CLIENT, address], env=env,
                               capture_output=True, text=True, timeout=300)
        assert plain.returncode != 0
        assert "Unavailable" in plain.stderr and "PW_TLS_CA" in plain.stderr, plain.stderr
    finally:
        pw("down", env=env, check=False)
    r = pw("controller", "--listen", "0.0.0.0:0", "--token", "t", env=dict(
        env, PW_CLUSTER_TOKEN="c"), check=False, timeout=30)
    assert r.returncode == 1 and "--insecure" in r.stderr, r.stderr


# Issue 20: random SIGKILL / SIGSTOP of island 0's workers (restarted as a cluster manager would)
# under 4 looping clients: every result right, every error naming a host, island 1 untouched and
# completing throughout, nothing leaked (python/tests/chaos.py checks and reports).
def test_chaos_kills_and_stalls_under_looping_clients():
    r = subprocess.run([sys.executable, str(ROOT / "python" / "tests" / "chaos.py"), "--clients",
                        "4", "--seconds", "45", "--every", "5"],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["passed"] and report["wrong"] == 0 and len(report["faults"]) >= 5, report


def test_a_traced_two_island_program_on_the_cluster(cluster, tmp_path):
    # Issue 22 item 1 on pw up (2 islands x 2 hosts x 2 devices): `pw trace` (the admin: every
    # tenant in full) records two clients' 2-island programs, from every worker process, on the
    # controller's clock; one client's own pw.trace shows its calls and the other's spans
    # anonymous.
    from trace_checks import check_runs
    env, address, _ = cluster
    admin = tmp_path / "admin.json"
    tracer = subprocess.Popen([str(PW), "trace", "--seconds", "300", "--out", str(admin)],
                              env=env, stderr=subprocess.PIPE, text=True)
    assert "recording" in tracer.stderr.readline()
    script = Path(__file__).with_name("traced_two_islands.py")
    cenv = dict(env, PW_CLUSTER=address)
    # They meet in tmp_path, so the untraced client's runs all fall in the other's trace.
    clients = [subprocess.Popen([sys.executable, str(script), trace, str(tmp_path / f"{i}.info"),
                                 "3", "4", str(tmp_path)], env=cenv, stderr=subprocess.PIPE,
                                text=True)
               for i, trace in enumerate([str(tmp_path / "mine.json"), "-"])]
    for c in clients:
        _, err = c.communicate(timeout=300)
        assert c.returncode == 0, err
    tracer.send_signal(signal.SIGINT)
    _, err = tracer.communicate(timeout=60)
    assert tracer.returncode == 0, err
    assert "from 5 processes" in err, err  # The controller and the four workers.
    info = json.loads((tmp_path / "0.info").read_text())
    islands = {int(k): v for k, v in info["islands"].items()}
    devices = islands[0] + islands[1]
    # The admin's trace holds the workers' and controller's spans (the clients' calls are in
    # their own processes): both clients' runs, in gang order on every device.
    check_runs(admin, devices=devices, runs_per_device=6, transfer_bytes=info["shard_bytes"],
               want_calls=False, clients=2, islands=islands)
    # The client's own trace adds its calls, linked by flows down to every device.
    t = check_runs(tmp_path / "mine.json", devices=devices, runs_per_device=3,
                   transfer_bytes=info["shard_bytes"], islands=islands)
    others = [s for s in t.of("compute") if s["name"].startswith("another tenant's")]
    assert others and all(set(s.get("args", {})) <= {"client"} for s in others)


def test_dashboard_shows_the_cluster_and_two_tenants_in_headless_chromium(cluster, tmp_path):
    # Issue 22 item 3: pw dashboard serves the cluster as the paper draws it, live, with two
    # tenants' programs on the timeline; Chromium (headless) loads the page and its DOM shows
    # them. The screenshot goes to $PW_DASHBOARD_SCREENSHOT if set (the README's), else tmp.
    import shutil
    import urllib.request
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/install-deps.sh installs it)")
    env, address, _ = cluster
    script = Path(__file__).with_name("tenant_load.py")
    cenv = dict(env, PW_CLUSTER=address)
    tenants = [subprocess.Popen([sys.executable, str(script), name, "4", "60"], env=cenv,
                                stderr=subprocess.PIPE, text=True) for name in ("alice", "bob")]
    r = pw("dashboard", "--detach", env=env)
    url = r.stdout.strip().splitlines()[-1]
    pid = int(re.search(r"process (\d+) serves", r.stderr).group(1))
    try:
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 120
        while True:  # Until a timeline window holds both tenants.
            state = json.loads(urllib.request.urlopen(url + "api/state", timeout=10).read())
            # Each is its own tenant, "<client>:<id>".
            names = {n.split(":")[0] for n in (state.get("timeline") or {}).get("tenants", {}).values()}
            if {"alice", "bob"} <= names:
                break
            for t in tenants:
                assert t.poll() is None, t.stderr.read()
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage"]
        dom = subprocess.run(flags + ["--virtual-time-budget=4000", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120).stdout
        assert dom.count('class="island"') == 2, dom[:2000]
        assert dom.count('class="host"') == 4
        assert dom.count('class="device"') == 8
        assert re.search(r'data-tenant="alice:\d+"', dom) and re.search(r'data-tenant="bob:\d+"', dom)
        assert "busy " in dom and "DCN in" in dom
        shot = Path(os.environ.get("PW_DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
        # Real time (not virtual), so the page has two samples for its rates.
        r = subprocess.run(flags + ["--timeout=5000", "--window-size=1280,1000",
                                    f"--screenshot={shot}", url],
                           capture_output=True, text=True, timeout=120)
        assert shot.exists() and shot.stat().st_size > 10000, r.stderr[-2000:]
    finally:
        log = Path(env["PW_STATE_DIR"]) / "dashboard.log"
        assert alive(pid), log.read_text() if log.exists() else "no dashboard.log"
        os.kill(pid, signal.SIGTERM)
        for t in tenants:
            t.kill()
            t.wait()


def test_lm_bench_on_pw_up_reports_every_layout(cluster):
    # `pw bench lm --json` on the README's cluster: the three layouts agree with one device, the
    # SPMD step's all-reduces cross worker processes, and only the two-island pipeline moves
    # activations and gradients over DCN.
    env, address, _ = cluster
    r = subprocess.run([str(PW), "bench", "lm", "--json", "--cluster", address,
                        "--timed-steps", "3"], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {x["layout"]: x for x in json.loads(r.stdout)["results"]}
    assert set(rows) == {"spmd", "pipeline", "pipeline_2islands"}
    assert rows["spmd"]["mesh"] == {"data": 2, "model": 2}  # Model-parallel psums cross nothing;
    # the data-parallel pmean crosses the island's two worker processes.
    for x in rows.values():
        assert x["loss_rel_diff_vs_one_device"] <= 1e-5, x
        assert x["tokens_per_second"] > 0 and 0.0 <= x["bubble_fraction"] < 1.0
    assert rows["pipeline"]["dcn_bytes_per_step"] == 0
    assert rows["pipeline_2islands"]["dcn_bytes_per_step"] > 0


def test_lm_is_served_by_another_process_while_it_trains_on_pw_up(cluster):
    # examples/lm/serve.py on pw up: the server is a process of its own (tenant "serve") that
    # imports the trainer's published weights; its last answer is checked against plain JAX.
    env, address, _ = cluster
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "lm" / "serve.py"), "--json",
                        "--steps", "12"], capture_output=True, text=True, timeout=600,
                       env=dict(env, PW_CLUSTER=address))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["ok"] and out["requests"] > 0, out
    t0 = time.monotonic()  # Trainer and server both gone (their sessions end as they exit).
    while status(env)["clients"] > 0 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    assert status(env)["clients"] == 0


def test_lm_recovers_from_a_killed_worker_on_pw_up(cluster):
    # examples/lm/recover.py on pw up: host 1's worker process is killed after step 6; the
    # trainer (same process) restores step 4's checkpoint, written by the workers, onto the
    # devices that remain and ends with plain JAX's loss.
    env, address, state = cluster
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "lm" / "recover.py"), "--json"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(env, PW_CLUSTER=address))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert "host:1" in out["error"] and out["loss_rel_diff_vs_one_device"] <= 1e-5, out
    assert not alive(state["worker_pids"][1])
    assert os.listdir(os.path.join(env["PW_STATE_DIR"], "checkpoints", "lm-recover"))
