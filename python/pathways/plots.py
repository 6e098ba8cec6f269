"""Plots of traces and benchmarks (matplotlib, headless).

    python -m pathways.plots trace TRACE.json OUT.png        # devices x time, as the paper's Fig. 9
    python -m pathways.plots bench NAME RESULT.json OUT.png  # a `pw bench NAME --json` result

`pw trace --plot` and `pw bench ... --plot` run these; `make figures` draws the README's.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = plt.get_cmap("tab10").colors


def load_trace(path: str) -> dict:
    """The spans of a Chrome trace JSON written by pw trace / pw.trace / PW_TRACE, by track:
    {"tracks": {(pid, tid): name}, "spans": [event, ...]} (complete events only)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    tracks = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tracks[(e["pid"], e["tid"])] = e["args"]["name"]
    return {"tracks": tracks, "spans": [e for e in events if e.get("ph") == "X"]}


def device_rows(trace: dict) -> list:
    """(pid, tid, name) of every device track, in device order."""
    rows = [(pid, tid, name) for (pid, tid), name in trace["tracks"].items()
            if name.startswith("device ")]
    return sorted(rows, key=lambda r: int(r[2].split()[1]))


def plot_trace(trace_path: str, out: str, title: str | None = None) -> None:
    """Each device a row, each computation a bar coloured by its tenant (client), as in Fig. 9."""
    trace = load_trace(trace_path)
    rows = device_rows(trace)
    row_of = {(pid, tid): i for i, (pid, tid, _) in enumerate(rows)}
    spans = [s for s in trace["spans"]
             if (s["pid"], s["tid"]) in row_of and s.get("cat") in ("compute", "collective")]
    if not spans:
        raise SystemExit(f"{trace_path}: no device computations to draw")
    t0 = min(s["ts"] for s in spans)
    tenants = {}
    for s in spans:
        args = s.get("args", {})
        key = args.get("client", -1)
        tenants.setdefault(key, args.get("tenant", f"client {key}"))
    color_of = {c: _COLORS[i % len(_COLORS)] for i, c in enumerate(sorted(tenants))}
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    for s in spans:
        if s.get("cat") != "compute":
            continue
        r = row_of[(s["pid"], s["tid"])]
        c = s.get("args", {}).get("client", -1)
        ax.broken_barh([((s["ts"] - t0) / 1e3, max(s["dur"] / 1e3, 1e-3))], (r - 0.4, 0.8),
                       facecolors=color_of[c], linewidth=0)
    ax.set_yticks(range(len(rows)), [name for _, _, name in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "Computations per device, coloured by client")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color_of[c]) for c in sorted(tenants)]
    ax.legend(handles, [tenants[c] for c in sorted(tenants)], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _line(ax, xs, ys, label, marker="o"):
    ax.plot(xs, ys, marker=marker, label=label)


def plot_bench(name: str, result_path: str, out: str) -> None:
    """A benchmark's result JSON (`pw bench NAME --json`) as a chart."""
    with open(result_path) as f:
        r = json.load(f)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _BENCHES[name](r, ax)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list) -> int:
    if len(argv) == 3 and argv[0] == "trace":
        plot_trace(argv[1], argv[2])
    elif len(argv) == 4 and argv[0] == "bench":
        if argv[1] not in _BENCHES:
            raise SystemExit(f"no plot for benchmark '{argv[1]}' (plots: {', '.join(_BENCHES)})")
        plot_bench(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(__doc__)
    print(f"pathways.plots: wrote {argv[-1]}", file=sys.stderr)
    return 0


def _dispatch(r, ax):
    """Computations per second of each workload, parallel beside sequential dispatch (§5.1)."""
    rows = r["results"]
    workloads = [w for w in ("opbyop", "chained", "fused") if any(x["workload"] == w for x in rows)]
    modes = sorted({x["dispatch"] for x in rows})
    width = 0.8 / max(1, len(modes))
    for i, m in enumerate(modes):
        ys = [next((x["computations_per_second"] for x in rows
                    if x["workload"] == w and x["dispatch"] == m), 0) for w in workloads]
        ax.bar([j + i * width for j in range(len(workloads))], ys, width, label=f"{m} dispatch")
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(workloads))], workloads)
    ax.set_yscale("log")
    ax.set_ylabel("computations / s")
    s = r.get("summary", {})
    ax.set_title(f"Dispatch (§5.1): chain of {s.get('chain', '?')}, {s.get('cluster', '')}")


def _transfer(r, ax):
    """Throughput by size: pathways' ICI and DCN paths beside their baselines (dashed)."""
    rows = r["results"]
    for path in sorted({x["path"] for x in rows}):
        mine = sorted((x for x in rows if x["path"] == path), key=lambda x: x["bytes"])
        xs = [x["bytes"] for x in mine]
        line, = ax.plot(xs, [x["pathways_bytes_per_second"] / 1e6 for x in mine], marker="o",
                        label=f"pathways {path}")
        ax.plot(xs, [x["baseline_bytes_per_second"] / 1e6 for x in mine], linestyle="--",
                color=line.get_color(), label=f"{mine[0]['baseline']} ({path} baseline)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes per transfer")
    ax.set_ylabel("MB / s")
    ax.set_title("Transfers: pathways beside its baselines")


def _collectives(r, ax):
    """All-reduce bus bandwidth by size, per process count and algorithm."""
    rows = r["results"]
    for key in sorted({(x["processes"], x["algorithm"]) for x in rows}):
        mine = sorted((x for x in rows if (x["processes"], x["algorithm"]) == key),
                      key=lambda x: x["bytes"])
        ax.plot([x["bytes"] for x in mine], [x["bus_gbps"] for x in mine], marker="o",
                label=f"{key[0]} processes, {key[1]}")
    big = max(rows, key=lambda x: x["bytes"])
    ax.axhline(big["tcp_gbps"], color="gray", linestyle=":", label="raw loopback TCP")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes per shard")
    ax.set_ylabel("bus GB/s")
    ax.set_title("All-reduce across worker processes")


def _multitenant(r, ax):
    """Each tenant's achieved share of the device time beside its configured share (§5.2), per
    measurement; the worst 100 ms window as an error bar."""
    x = 0
    ticks, labels = [], []
    for i, res in enumerate(r["results"]):
        for s in res["shares"]:
            ax.bar(x - 0.2, s["configured"], 0.4, color="lightgray",
                   label="configured" if x == 0 else None)
            low, high = sorted((s["achieved"], s["worst_window"]))
            ax.bar(x + 0.2, s["achieved"], 0.4, color="C0", label="achieved" if x == 0 else None,
                   yerr=[[s["achieved"] - low], [high - s["achieved"]]], capsize=3)
            ticks.append(x)
            labels.append(s["tenant"])
            x += 1
        x += 1
    ax.set_xticks(ticks, labels, rotation=45, fontsize=7)
    ax.set_ylabel("fraction of device time")
    first = r["results"][0]
    ax.set_title(f"Proportional share: {first['clients']} clients, {first['compute_ms']} ms "
                 f"computations, {first['aggregate_per_second']:.0f} calls/s "
                 f"({first['aggregate_per_second'] / first['single_client_per_second']:.2f}x one)")


_BENCHES = {"dispatch": _dispatch, "transfer": _transfer, "transfer-cluster": _transfer,
            "collectives": _collectives, "multitenant": _multitenant}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
