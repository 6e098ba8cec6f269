"""Checks of a Chrome trace JSON written by pw trace / pw.trace / PW_TRACE (pw/trace/README.md):
what a traced program's runs must show, whichever process recorded them."""
import collections
import json


class Trace:
    def __init__(self, path):
        with open(path) as f:
            doc = json.load(f)
        self.doc = doc
        events = doc["traceEvents"]
        self.tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                       if e.get("ph") == "M" and e.get("name") == "thread_name"}
        self.spans = [e for e in events if e.get("ph") == "X"]
        self.flow_out = {e["id"]: e for e in events if e.get("ph") == "s"}
        self.flow_in = {e["id"]: e for e in events if e.get("ph") == "f"}

    def track(self, e):
        return self.tracks[(e["pid"], e["tid"])]

    def of(self, cat):
        return [s for s in self.spans if s.get("cat") == cat]

    def enclosing(self, e):
        """The span on e's track whose time holds e (a flow's end binds to it)."""
        best = None
        for s in self.spans:
            if (s["pid"], s["tid"]) == (e["pid"], e["tid"]) and \
                    s["ts"] - 1e-3 <= e["ts"] <= s["ts"] + s["dur"] + 1e-3:
                if best is None or s["dur"] < best["dur"]:  # The innermost.
                    best = s
        return best

    def flows_into(self, span):
        return [f for f in self.flow_in.values()
                if (f["pid"], f["tid"]) == (span["pid"], span["tid"]) and
                span["ts"] - 1e-3 <= f["ts"] <= span["ts"] + span["dur"] + 1e-3]


CHAIN = ["compute", "dispatch", "schedule", "submit", "call"]


def chain_to_call(t: Trace, compute_span):
    """The spans from a device's computation back to its client's call, following flows."""
    path = [compute_span]
    for want in CHAIN[1:]:
        ins = t.flows_into(path[-1])
        assert ins, f"no flow into the {path[-1]['cat']} span {path[-1]['name']}"
        ups = [t.enclosing(t.flow_out[f["id"]]) for f in ins if f["id"] in t.flow_out]
        ups = [u for u in ups if u is not None and u["cat"] == want]
        assert ups, f"the {path[-1]['cat']} span {path[-1]['name']} has no flow from a {want} span"
        path.append(ups[0])
    return path


def check_runs(path, *, devices, runs_per_device, transfer_bytes=None, link="dcn",
               want_calls=True, clients=None, islands=None):
    """A trace of `runs_per_device` runs on every device of `devices` (ids): each device's
    computations, the transfers between islands with their bytes, flows from each run's first
    computation on a device back to its client's call (if the trace holds the client's
    process), and every device of an island computing in its island scheduler's gang order."""
    t = Trace(path)
    compute = collections.defaultdict(list)
    for s in t.of("compute"):
        compute[int(t.track(s).split()[1])].append(s)
    for d in devices:
        runs = {s["args"]["run"] for s in compute[d] if "run" in s.get("args", {})}
        assert len(runs) >= runs_per_device, (d, len(runs))
    if transfer_bytes is not None:
        transfers = [s for s in t.of("transfer") if s.get("args", {}).get("link") == link]
        assert transfers, "no transfers between islands"
        assert all(s["args"]["bytes"] == transfer_bytes for s in transfers), \
            {s["args"]["bytes"] for s in transfers}
    if want_calls:
        followed = 0
        for d in devices:
            for s in compute[d]:
                if "run" in s.get("args", {}) and t.flows_into(s):  # Not another tenant's.
                    chain = chain_to_call(t, s)
                    assert len({c.get("args", {}).get("client") for c in chain}) == 1
                    assert t.track(chain[-1]).startswith("client ")
                    followed += 1
        assert followed >= len(devices) * runs_per_device
    # Gang order: every device of an island runs in its scheduler's order.
    for island, island_devices in (islands or {}).items():
        decided = sorted((s["args"]["gang_position"], s["args"]["run"]) for s in t.of("schedule")
                         if t.track(s) == f"island {island} scheduler" and "run" in s.get("args", {}))
        position = {run: i for i, (_, run) in enumerate(decided)}
        assert position, f"no scheduling decisions of island {island}"
        for d in island_devices:
            ran = [s["args"]["run"] for s in sorted(compute[d], key=lambda s: s["ts"])
                   if "run" in s.get("args", {})]
            at = [position[r] for r in ran if r in position]
            assert at == sorted(at), f"device {d} left island {island}'s gang order: {ran}"
    if clients is not None:
        seen = {s.get("args", {}).get("client") for s in t.of("compute")}
        assert len(seen) >= clients, seen
    return t
