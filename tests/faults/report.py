"""The chaos run's markdown report, with a timeline picture (SVG) of faults and grants."""

from __future__ import annotations

import json
from pathlib import Path

from checker import episodes_of
from harness import read_history

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


def timeline_svg(out: Path) -> str:
    hist = read_history(str(out / "history.jsonl"))
    faults = [json.loads(x) for x in open(out / "faults.jsonl")] if (out / "faults.jsonl").exists() else []
    eps = list(episodes_of(hist).values())
    times = [e.start for e in eps] + [f["start"] for f in faults]
    if not times:
        return ""
    t0 = min(times)
    t1 = max([min(e.end, e.start + 60) for e in eps] + [f.get("end", f["start"]) for f in faults])
    width, left = 1400, 160
    scale = (width - left - 20) / max(t1 - t0, 1e-3)
    keys = sorted({e.key for e in eps})
    kinds = sorted({f["fault"] for f in faults})
    rows = [("grants " + k) for k in keys] + kinds
    rh = 22
    height = rh * len(rows) + 40
    x = lambda t: left + (t - t0) * scale  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="monospace" font-size="11">']
    for i, r in enumerate(rows):
        parts.append(f'<text x="4" y="{i * rh + 15}">{r}</text>')
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{i * rh + rh}" y2="{i * rh + rh}" '
                     'stroke="#eee"/>')
    for e in eps:
        i = keys.index(e.key)
        end = min(e.end, e.start + 60)
        c = COLORS[hash(e.client.split("/")[0].split(".")[0]) % len(COLORS)]
        parts.append(f'<rect x="{x(e.start):.1f}" y="{i * rh + 3}" width="{max(1, (end - e.start) * scale):.1f}" '
                     f'height="{rh - 6}" fill="{c}" opacity="0.7"><title>{e.id} fence {e.fence}</title></rect>')
    for f in faults:
        i = len(keys) + kinds.index(f["fault"])
        end = f.get("end", f["start"])
        parts.append(f'<rect x="{x(f["start"]):.1f}" y="{i * rh + 3}" width="{max(2, (end - f["start"]) * scale):.1f}" '
                     f'height="{rh - 6}" fill="#444"><title>{f["fault"]} {f.get("target")}</title></rect>')
    for s in range(0, int(t1 - t0) + 1, max(1, int((t1 - t0) / 20) or 1)):
        parts.append(f'<text x="{x(t0 + s):.1f}" y="{height - 8}">{s}s</text>')
    parts.append("</svg>")
    svg = "\n".join(parts)
    (out / "timeline.svg").write_text(svg)
    return "timeline.svg"


def render(report: dict, violations: dict, out: Path | None = None) -> str:
    s = report["signals"]
    pic = timeline_svg(out) if out else ""
    lost_total = s["lost"]
    sides = report["sides"]
    lines = [
        f"# ferrolock chaos run: seed {report['seed']}, {report['duration']:.0f} s",
        "",
        f"Replay: `make chaos DURATION={report['duration']:.0f} SEED={report['seed']}`",
        "",
        "| figure | value |", "|---|---|",
        f"| grants (episodes; re-entries inside) | {report['grants']} ({report['reentries']} re-entries) |",
        f"| acquire calls / granted | {report['acquires']} / {report['acquire_ok']} |",
        f"| acquire failures by kind | {report['acquire_errors']} |",
        f"| grants by kind: lock / read / write / semaphore | {sides.get('lock', 0)} / "
        f"{sides.get('read', 0)} / {sides.get('write', 0)} / {sides.get('semaphore', 0)} |",
        f"| overlapping grants (a lock or a writer with anyone) | {len(report['overlaps'])} |",
        f"| read holds sharing the key (allowed) / reads under the owner's own write hold "
        f"(downgrades, allowed) | {report['shared_reads']} / {report['downgrades']} |",
        f"| semaphore over-grants / most permits held at once | {len(report['over_granted'])} / "
        f"{_peaks(report['permits_peak'])} |",
        f"| fence order violations | {len(report['fence_violations'])} |",
        f"| resource writes / rejected by the fence | {report['resource_writes']} / {report['resource_rejected']} |",
        f"| lost updates (fenced resource) | {len(report['lost_updates'])} |",
        f"| resource use after the writer's own deadline (stale use; rejected when fenced) | {len(report['stale_use'])} |",
        f"| release/extend touching another owner's key | {len(report['non_owner_touch'])} |",
        f"| loss signals / before the deadline / late, client paused across it / late otherwise | "
        f"{lost_total} / {s['before_deadline']} / {s['late_excused']} / {len(s['late'])} |",
        f"| deadlines passed without release or signal (client running) | {len(s['missing'])} |",
        f"| acquire latency p50 / p99 / max (s) | {_f(report['latency']['p50'])} / "
        f"{_f(report['latency']['p99'])} / {_f(report['latency']['max'])} |",
        f"| faults injected | {report['faults']} |",
        f"| forks / child saw the parent's lock as held | {report['forks']} / {len(report['fork_inherited_held'])} |",
        f"| calls cancelled by SIGINT | {report['interrupted']} |",
        f"| harness errors in clients | {len(report['client_errors'])} |",
        "",
        "Time from each fault's end to the next grant (any key, any client):",
        "",
        "| fault | n | median s | max s |", "|---|---|---|---|",
    ]
    for k, v in report["recovery"].items():
        lines.append(f"| {k} | {v['n']} | {_f(v['median'])} | {_f(v['max'])} |")
    lines += ["", "Violations: " + (json.dumps(violations) if violations else "none"), ""]
    for k in ("overlaps", "over_granted", "fence_violations", "lost_updates", "non_owner_touch"):
        for item in report[k][:10]:
            lines.append(f"- {k}: `{json.dumps(item, default=str)}`")
    for item in s["late"][:10] + s["missing"][:10]:
        lines.append(f"- signal: `{json.dumps(item, default=str)}`")
    if pic:
        lines += ["", f"![timeline of grants per key and faults]({pic})", ""]
    return "\n".join(lines)


def _peaks(peaks: dict) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(peaks.items())) or "-"


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"
