"""Chaos on a `pw up` cluster: clients loop checked programs while workers of island 0 are killed
(SIGKILL), stalled (SIGSTOP past the failure timeout) and restarted.

    python python/tests/chaos.py --clients 4 --seconds 60 --every 5

Island 1 is never touched. At the end it checks, and prints as one JSON object on stdout:
- every result that came back was right (`wrong` = 0);
- every error names a host (`unnamed_errors` = 0), and none came from a slice on island 1;
- island 1 completed programs in every window of the run (`island1_idle_windows` = 0);
- nothing leaked once the clients are gone and every host is back: no logical buffers, no
  buffers or memory on any host, no growth of the controller's and island 1 workers' fds and
  threads, no /dev/shm segments of dead processes;
- RSS and threads of the controller and island 1 workers over the second half (`rss_drift`,
  `threads_second_half`).
Exit status 1 if any check failed. `test_cluster.py` runs it briefly; the soak in a closing note
is a long run of it.
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PW = ROOT / "build" / "bin" / "pw"


def pw(*args, env, check=True, timeout=120):
    r = subprocess.run([str(PW), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"pw {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def count(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def client(address, index, stop_at, results):
    """Loops programs with known results; reports (island, ok, wrong, errors) per program."""
    import numpy as np
    import jax
    import pathways as pw
    pw.connect(address)
    ds = pw.make_virtual_device_set()
    rng = np.random.default_rng(index)
    s = fns = None
    while time.time() < stop_at:
        try:
            if s is None:
                s = ds.add_slice(devices=2)
                island = s.islands[0]
                fns = (pw.pmap(lambda x: x * 2.0 + 1.0, devices=s),
                       pw.pmap(lambda x: jax.lax.psum(x, "i"), devices=s, axis_name="i"))
            x = rng.standard_normal((2, 3)).astype(np.float32)
            y = np.asarray(fns[0](x), dtype=np.float32)
            z = np.asarray(fns[1](x), dtype=np.float32)
            good = np.allclose(y, x * 2 + 1, atol=1e-5) and np.allclose(
                z, np.broadcast_to(x.sum(0), x.shape), atol=1e-5)
            results.put(("result", island, bool(good), time.time()))
        except pw.errors.Error as e:
            results.put(("error", island if s is not None else -1, str(e), time.time()))
            if s is not None:
                try:
                    s.release()
                except pw.errors.Error:
                    pass
            s = None  # A new slice, on the devices alive now.
            time.sleep(0.1)
    results.put(("done", index, "", time.time()))


class Cluster:
    def __init__(self, state_dir, failure_timeout_ms):
        self.env = dict(os.environ, PW_STATE_DIR=str(state_dir))
        self.env.pop("PW_CLUSTER", None)
        self.address = pw("up", "--detach", "--islands", "2", "--hosts-per-island", "2",
                          "--devices-per-host", "2", "--failure-timeout-ms",
                          str(failure_timeout_ms), env=self.env).stdout.strip().splitlines()[-1]
        self.state = json.loads((Path(state_dir) / "cluster.json").read_text())
        self.workers = list(self.state["worker_pids"])  # By host; replaced when restarted.
        self.logs = Path(state_dir)
        self.restarts = 0

    def status(self):
        return json.loads(pw("status", "--json", env=self.env).stdout)

    def restart(self, host):
        """Starts host's worker again (as a cluster manager would)."""
        argv = [str(PW), "worker", "--controller", self.address, "--host", str(host)]
        cpus = self.state.get("worker_cpus", [""] * len(self.workers))[host]
        if cpus:
            argv += ["--cpus", cpus]
        log = open(self.logs / f"worker-{host}-restart-{self.restarts}.log", "w")
        env = dict(self.env, PW_CLUSTER_TOKEN=self.state["cluster_token"])
        self.workers[host] = subprocess.Popen(argv, stdout=log, stderr=log, env=env,
                                              start_new_session=True).pid
        self.restarts += 1

    def wait_all_alive(self, timeout=60):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            hosts = self.status()["hosts"]
            if all(h["alive"] for h in hosts):
                return True
            for h, pid in enumerate(self.workers):  # A stalled one exits when it wakes.
                if not alive(pid) and not hosts[h]["alive"]:
                    self.restart(h)
            time.sleep(0.2)
        return False

    def down(self):
        pw("down", env=self.env, check=False)
        for pid in self.workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def stale_segments():
    """/dev/shm segments of this runtime whose creating process is gone."""
    n = 0
    for name in os.listdir("/dev/shm"):
        m = re.match(r"pw-(?:arena|xfer|mbox)-(\d+)-", name)
        if m and not alive(int(m.group(1))):
            n += 1
    return n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--every", type=float, default=5, help="seconds between faults")
    p.add_argument("--window", type=float, default=10, help="island 1 must complete in each")
    p.add_argument("--failure-timeout-ms", type=int, default=1500)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    random.seed(a.seed)
    state_dir = tempfile.mkdtemp(prefix="pw-chaos-")
    c = Cluster(state_dir, a.failure_timeout_ms)
    report = {"clients": a.clients, "seconds": a.seconds, "faults": []}
    try:
        controller = c.state["controller_pid"]
        island1 = c.workers[2:]  # Hosts 2 and 3.
        watched = [controller, *island1]
        before = {pid: (count(f"/proc/{pid}/fd"), count(f"/proc/{pid}/task")) for pid in watched}
        results = mp.get_context("spawn").Queue()
        start = time.time()
        stop_at = start + a.seconds
        procs = [mp.get_context("spawn").Process(target=client,
                                                 args=(c.address, i, stop_at, results))
                 for i in range(a.clients)]
        for q in procs:
            q.start()
        rss = {pid: [] for pid in watched}
        tasks = {pid: [] for pid in watched}  # Thread counts, sampled with rss.
        events = []
        next_fault = time.time() + a.every
        stopped = None  # (host, pid, until)
        while any(q.is_alive() for q in procs) or not results.empty():
            while not results.empty():
                events.append(results.get())
            now = time.time()
            for pid in watched:
                rss[pid].append((now - start, rss_kb(pid)))
                tasks[pid].append((now - start, count(f"/proc/{pid}/task")))
            if stopped and now >= stopped[2]:
                os.kill(stopped[1], signal.SIGCONT)  # Declared failed meanwhile: it exits.
                stopped = None
            if now >= next_fault and now < stop_at - a.every and stopped is None:
                host = random.choice([0, 1])
                pid = c.workers[host]
                if random.random() < 0.7:
                    os.kill(pid, signal.SIGKILL)
                    report["faults"].append([round(now - start, 1), "SIGKILL", host])
                else:
                    os.kill(pid, signal.SIGSTOP)
                    stopped = (host, pid, now + 2 * a.failure_timeout_ms / 1000)
                    report["faults"].append([round(now - start, 1), "SIGSTOP", host])
                next_fault = now + a.every
            # Restart what is dead once the controller has noticed (a cluster manager's job).
            hosts = c.status()["hosts"]
            for h in (0, 1):
                if not alive(c.workers[h]) and not hosts[h]["alive"]:
                    c.restart(h)
            time.sleep(0.2)
        for q in procs:
            q.join()
        if stopped:
            os.kill(stopped[1], signal.SIGCONT)
        report["all_hosts_back"] = c.wait_all_alive()

        ok = [e for e in events if e[0] == "result" and e[2]]
        wrong = [e for e in events if e[0] == "result" and not e[2]]
        errors = [e for e in events if e[0] == "error"]
        report["programs_ok"] = 2 * len(ok)
        report["wrong"] = len(wrong)
        report["errors"] = len(errors)
        report["unnamed_errors"] = sum(1 for e in errors if "host:" not in e[2])
        report["island1_errors"] = sum(1 for e in errors if e[1] == 1)
        report["error_samples"] = sorted({re.sub(r"\d+", "N", e[2])[:160] for e in errors})[:8]
        windows = int(a.seconds // a.window)
        done1 = [e[3] - start for e in ok if e[1] == 1]
        report["island1_idle_windows"] = sum(
            1 for w in range(windows)
            if not any(w * a.window <= t < (w + 1) * a.window for t in done1))
        report["restarts"] = c.restarts

        # Leaks, once the clients are gone (their buffers are freed as they disconnect).
        t0 = time.monotonic()
        s = c.status()
        while time.monotonic() - t0 < 30:
            s = c.status()
            busy = s["logical_buffers"] or s["runs_in_flight"] or any(
                h.get("buffers") or any(d["memory_in_use"] for d in h.get("devices", []))
                for h in s["hosts"])
            if not busy:
                break
            time.sleep(0.2)
        report["logical_buffers_left"] = s["logical_buffers"]
        report["host_buffers_left"] = sum(h.get("buffers", 0) for h in s["hosts"])
        report["memory_in_use_left"] = sum(d["memory_in_use"] for h in s["hosts"]
                                           for d in h.get("devices", []))
        after = {pid: (count(f"/proc/{pid}/fd"), count(f"/proc/{pid}/task")) for pid in watched}
        report["fds"] = {str(pid): [before[pid][0], after[pid][0]] for pid in watched}
        report["threads"] = {str(pid): [before[pid][1], after[pid][1]] for pid in watched}
        report["stale_shm_segments"] = stale_segments()
        drift, mb = {}, {}
        for pid, samples in rss.items():
            half = [kb for t, kb in samples if t >= a.seconds / 2 and kb]
            if len(half) >= 2:
                drift[str(pid)] = round((max(half[-5:]) - half[0]) / half[0], 4)
                mb[str(pid)] = [round(half[0] / 1024, 1), round(max(half[-5:]) / 1024, 1)]
        report["rss_drift"] = drift  # Over the second half: (end - start) / start.
        report["rss_mb_second_half"] = mb  # [start, end]
        # Threads once warmed up (gRPC's pools start small and grow to their working size in the
        # first seconds of load): [at the second half's start, most at its end].
        report["threads_second_half"] = {
            str(pid): [half[0], max(half[-5:])] for pid, samples in tasks.items()
            for half in [[n for t, n in samples if t >= a.seconds / 2 and n > 0]] if half}
        report["roles"] = {str(controller): "controller", **{str(p): "island-1 worker"
                                                            for p in island1}}
        # Slack for gRPC's own pools, which grow on demand (threads) and keep a channel per peer;
        # growth with every fault would exceed it.
        leaks = [pid for pid in watched
                 if after[pid][0] > before[pid][0] + 8 or after[pid][1] > before[pid][1] + 16]
        report["leaking"] = [str(p) for p in leaks]
        failed = (report["wrong"] or report["unnamed_errors"] or report["island1_errors"] or
                  report["island1_idle_windows"] or not report["all_hosts_back"] or
                  report["logical_buffers_left"] or report["host_buffers_left"] or
                  report["memory_in_use_left"] or report["stale_shm_segments"] or leaks or
                  not ok)
        report["passed"] = not failed
        print(json.dumps(report, indent=1))
        return 1 if failed else 0
    finally:
        c.down()


if __name__ == "__main__":
    sys.exit(main())
