"""The ``coda-node status`` screen: the status document (:mod:`coda_node.status.document`) as text a
person reads in ten seconds, the way nvitop and ``pqos -s`` lay out a node.

Top to bottom: what is wrong (stale state, missing fields), the node (daemon, cores, GPUs,
memory and PCIe bandwidth, capabilities), one row per job, recent events. The screen fits the
terminal's width: narrow terminals lose the least important job columns (CPU use, memory
bandwidth, GPUs, user, ...) instead of wrapping, and long text is cut with ``...``. Colour
(ANSI SGR) only when asked: throttled or limited jobs yellow, probing cyan, errors red.
Pure: the caller passes the width, the clock and whether to colour; the registered
mechanisms say which events hold a job back (yellow,
:func:`~coda_node.status.document.throttle_actions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coda_node.status.document import local_time, throttle_actions
from coda_node.system.cpulist import format_cpulist

RED, YELLOW, CYAN, BOLD, DIM = "31", "33", "36", "1", "2"

MIN_DECISION_WIDTH = 20
"""The last decision's column gets at least this, or a third of a wider terminal."""


@dataclass(frozen=True, slots=True)
class Paint:
    color: bool

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on (escape, bell, line break,
    bidi override: not :meth:`str.isprintable`) shown as ``?``, so that a limit's reason or
    a name read from Slurm cannot move the cursor, recolour or split a row."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def fit(text: str, width: int) -> str:
    """``text`` (:func:`printable`) cut to ``width`` characters, ending in ``...`` when cut."""
    text = printable(text)
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[:width] if width <= 3 else text[: width - 3] + "..."


def bytes_rate(value: float | None) -> str:
    """``12.3GB/s`` (SI, as NVML and the kernel's counters are), ``-`` when unknown."""
    if value is None:
        return "-"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}B/s"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value != int(value) else f"{int(value)}"


# -- job cells --------------------------------------------------------------------------


def _cpu_cell(j: Mapping[str, Any]) -> str:
    rate = j["cpu_rate_cores"]
    return "-" if rate is None else f"{rate:.1f}"


def _now_cell(j: Mapping[str, Any]) -> str:
    quota, now = j["quota_cores"], j["cores_now"]
    if quota is not None and (now is None or quota < now):
        return f"{quota:g}q"
    return _num(now)


def _progress_cell(j: Mapping[str, Any]) -> str:
    """``97.4/s train`` (iterations), ``85% train`` (GPU utilisation), the phase alone, or
    the GPUs' utilisation for a job with no progress signal yet."""
    p = j["progress"]
    if p is None:
        util = j["gpu_util_pct"]
        return f"{util:.0f}%" if util is not None else "-"
    rate = p["rate"]
    if rate is None:
        return p["phase"]
    value = f"{rate:.3g}/s" if p["source"] == "iterations" else f"{rate:.0f}%"
    return f"{value} {p['phase']}"


def _throttle_cell(j: Mapping[str, Any]) -> str:
    """``3 mba``, ``5 mba+l3 L3 5/20 ways``, ``limit`` or ``-``."""
    t = j["throttle"]
    if t is not None and t["level"] > 0:
        mech = (t["mechanism"] or "").replace("+quota", "+q")
        text = f"{t['level']} {mech}".strip()
        if t.get("l3_ways") is not None:
            text += f" L3 {t['l3_ways']}/{t.get('l3_ways_total') or '?'} ways"
        return text
    if j["limit"] is not None:
        return "limit"
    return "-"


def _profile_cell(j: Mapping[str, Any]) -> str:
    """``probing 12c``, ``confident 6c``, ``known``, ``skipped``, ``-``."""
    state, prof = j["profile_state"], j["profile"] or {}
    if state is None:
        return "-"
    if state == "probing" and prof.get("cores_now") is not None:
        return f"probing {prof['cores_now']}c"
    if state in ("confident", "probed") and prof.get("sweet_spot_cores") is not None:
        return f"{state} {prof['sweet_spot_cores']}c"
    return state


def _decision_cell(j: Mapping[str, Any]) -> str:
    if j["failed"]:
        return "failed: " + "; ".join(j["failed"])
    d = j["last_decision"]
    if d is not None:
        return f"{d['action']}: {d['reason']}" if d["reason"] else d["action"]
    prof = j["profile"]
    if prof and prof["why"] and j["profile_state"] in ("skipped", "waiting"):
        return f"{j['profile_state']}: {prof['why']}"
    return "-"


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    cell: Callable[[Mapping[str, Any]], str]
    priority: int
    """Narrow terminals drop the lowest first."""
    cap: int
    right: bool = False


JOB_COLUMNS = (
    Column("JOBID", lambda j: str(j["job_id"]), 100, 10, right=True),
    Column("USER", lambda j: j["user"] or "?", 55, 8),
    Column("KIND", lambda j: {"dnn": "DNN", "cpu": "CPU"}.get(j["kind"], "?"), 85, 4),
    Column("GPUS", lambda j: format_cpulist(j["gpus"]) or "-", 30, 9),
    Column("ALLOC", lambda j: _num(j["cores_allocated"]), 90, 5, right=True),
    Column("PRED", lambda j: _num(j["cores_predicted"]), 65, 5, right=True),
    Column("NOW", _now_cell, 88, 6, right=True),
    Column("CPU", lambda j: _cpu_cell(j), 20, 6, right=True),
    Column("PROGRESS", _progress_cell, 60, 15),
    Column("MEMBW", lambda j: bytes_rate(j["mem_bw_bytes_per_s"]), 45, 9, right=True),
    Column("THR", _throttle_cell, 70, 24),
    Column("PROFILE", _profile_cell, 80, 13),
)
DECISION = Column("LAST DECISION", _decision_cell, 75, 10_000)


def _row_colour(j: Mapping[str, Any]) -> str | None:
    if j["failed"]:
        return RED
    if j["throttle_level"] > 0 or j["limit"] is not None:
        return YELLOW
    if j["profile_state"] == "probing":
        return CYAN
    return None


def job_table(jobs: Sequence[Mapping[str, Any]], width: int, paint: Paint) -> list[str]:
    """Header and one line per job, no line wider than ``width``."""
    cells = [[c.cell(j) for c in JOB_COLUMNS] for j in jobs]
    widths = [
        min(c.cap, max([len(c.header)] + [len(row[i]) for row in cells]))
        for i, c in enumerate(JOB_COLUMNS)
    ]
    shown = list(range(len(JOB_COLUMNS)))

    def used() -> int:
        return sum(widths[i] + 1 for i in shown)

    by_priority = sorted(shown, key=lambda i: JOB_COLUMNS[i].priority)
    min_decision = max(MIN_DECISION_WIDTH, width // 3)
    while used() + min_decision > width and len(shown) > 1:
        shown.remove(by_priority.pop(0))
    decision_width = max(0, width - used())

    def line(values: Sequence[str], decision: str) -> str:
        parts = []
        for i in shown:
            text = fit(values[i], widths[i])
            col = JOB_COLUMNS[i]
            parts.append(text.rjust(widths[i]) if col.right else text.ljust(widths[i]))
        text = " ".join(parts) + " " + fit(decision, decision_width)
        return fit(text.rstrip(), width)

    out = [paint(line([c.header for c in JOB_COLUMNS], DECISION.header), BOLD)]
    for j, row in zip(jobs, cells, strict=True):
        text = line(row, DECISION.cell(j))
        colour = _row_colour(j)
        out.append(paint(text, colour) if colour else text)
    return out


# -- the node -----------------------------------------------------------------------------


GPU_COLUMNS = (
    Column("GPU", lambda g: str(g["index"]), 100, 3, right=True),
    Column("MODEL", lambda g: (g["name"] or "?").removeprefix("NVIDIA "), 60, 22),
    Column(
        "UTIL",
        lambda g: f"{g['util_pct']:.0f}%" if g["util_pct"] is not None else "?",
        90,
        4,
        right=True,
    ),
    Column("MEMORY", lambda g: _gpu_memory(g), 40, 11, right=True),
    Column("PCIE RX", lambda g: bytes_rate(g["pcie_rx_bytes_per_s"]), 80, 9, right=True),
    Column("PCIE TX", lambda g: bytes_rate(g["pcie_tx_bytes_per_s"]), 80, 9, right=True),
    Column("JOBS", lambda g: ",".join(map(str, g["job_ids"])) or "-", 85, 10_000),
)


def _gpu_memory(g: Mapping[str, Any]) -> str:
    used, total = g["mem_used_bytes"], g["mem_total_bytes"]
    if used is None or total is None:
        return "?"
    return f"{used / 2**30:.0f}/{total / 2**30:.0f}GiB"


def gpu_table(gpus: Sequence[Mapping[str, Any]], width: int, paint: Paint) -> list[str]:
    cells = [[c.cell(g) for c in GPU_COLUMNS] for g in gpus]
    widths = [
        min(c.cap, max([len(c.header)] + [len(row[i]) for row in cells]))
        for i, c in enumerate(GPU_COLUMNS)
    ]
    shown = list(range(len(GPU_COLUMNS)))
    by_priority = sorted(shown[:-1], key=lambda i: GPU_COLUMNS[i].priority)
    while sum(widths[i] + 1 for i in shown[:-1]) + 5 > width and by_priority:
        shown.remove(by_priority.pop(0))

    def line(values: Sequence[str]) -> str:
        parts = []
        for i in shown:
            col = GPU_COLUMNS[i]
            text = fit(values[i], widths[i]) if col.cap < 10_000 else values[i]
            parts.append(text.rjust(widths[i]) if col.right else text.ljust(widths[i]))
        return fit(" ".join(parts).rstrip(), width)

    return [paint(line([c.header for c in GPU_COLUMNS]), BOLD)] + [line(row) for row in cells]


def flow(segments: Sequence[str], width: int, sep: str = " | ") -> list[str]:
    """Segments joined by ``sep`` on as few lines as ``width`` allows (each cut to fit)."""
    lines: list[str] = []
    for seg in map(printable, segments):
        if lines and len(lines[-1]) + len(sep) + len(seg) <= width:
            lines[-1] += sep + seg
        else:
            lines.append(fit(seg, width))
    return lines


def _unavailable(caps: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """Unavailable capabilities grouped by reason: the three RDT rows of a node without
    resctrl say ``resctrl not mounted`` once. A detail's leading label (``Intel RDT MBA:``)
    is dropped when grouping, since the capability's name says the same."""
    groups: dict[str, list[str]] = {}
    for c in caps:
        if c["available"]:
            continue
        detail = c["detail"] or "?"
        label, sep, rest = detail.partition(": ")
        if sep and len(label) <= 20 and "(" not in label:
            detail = rest
        groups.setdefault(detail, []).append(c["name"])
    return [(reason, names) for reason, names in groups.items()]


def node_lines(doc: Mapping[str, Any], width: int, paint: Paint) -> list[str]:
    daemon, node = doc["daemon"], doc["node"]
    state = daemon["status"]
    pid = f" (pid {daemon['pid']})" if daemon["pid"] is not None else ""
    head = [
        f"node {daemon['node_name'] or '?'}",
        f"coda-node {daemon['version'] or '?'} {state}{pid}",
        f"last tick {_age(doc['state']['age_s'])} ago, every {daemon['interval_s']:g} s",
    ]
    shape = []
    if node["cores"] is not None:
        shape.append(f"{node['cores']} cores")
    shape.append(f"{len(node['gpus'])} GPU{'s' if len(node['gpus']) != 1 else ''}")
    if node["cgroup_version"] is not None:
        shape.append(f"cgroup v{node['cgroup_version']}")
    head.append(", ".join(shape))
    head.append("enforcing " + (",".join(daemon["enforce"]) or "nothing (observe only)"))
    out = flow(head, width)
    policies = [
        f"profiling: {daemon['profiling'] or '?'}",
        f"contention: {daemon['contention'] or '?'}",
    ]
    metrics = daemon["metrics"]
    if metrics and not metrics.startswith("off"):
        policies.append(f"metrics: {metrics}")
    out += flow(policies, width)
    caps = node["capabilities"]
    active = [c["name"] for c in caps if c["available"]]
    if active:
        out.append(fit("active: " + ", ".join(active), width))
    for reason, names in _unavailable(caps):
        out.append(paint(fit(f"unavailable: {', '.join(names)}: {reason}", width), DIM))
    mem = node["mem_bw"]
    if mem:
        per = [f"socket {m['socket']} {bytes_rate(m['bytes_per_s'])}" for m in mem]
        out.append(fit("memory bandwidth: " + ", ".join(per), width))
    elif node["mem_bw_unavailable"] is None or not any(
        c["name"] == "uncore memory bandwidth" for c in caps
    ):
        # (When the capability is listed as unavailable, the line above says why.)
        out.append(fit("memory bandwidth: not measured", width))
    # Only when measured: where the IIO counters are missing the capabilities say why.
    pcie = [
        f"socket {p['socket']} in {bytes_rate(p['in_bytes_per_s'])} "
        f"out {bytes_rate(p['out_bytes_per_s'])}"
        for p in node.get("pcie_bw") or []
    ]
    if pcie:
        out.append(fit("PCIe: " + ", ".join(pcie), width))
    out.append("")
    if node["gpus"]:
        out += gpu_table(node["gpus"], width, paint)
    elif any(c["name"] == "GPUs (NVML)" and not c["available"] for c in caps):
        out.append("GPUs: none (GPUs (NVML) unavailable, above)")
    else:
        nvml = node["nvml"]
        why = nvml["detail"] if nvml else "no GPU in the daemon's view"
        out.append(fit(f"GPUs: none ({why})", width))
    return out


def event_lines(events: Sequence[Mapping[str, Any]], width: int, paint: Paint) -> list[str]:
    out = []
    held_back = throttle_actions()
    for e in events:
        when = local_time(e["unix_s"], "%H:%M:%S", "??") if e["unix_s"] else "??"
        text = fit(f"  {when}  job {e['job_id']}  {e['what']}: {e['reason']}", width)
        if e["action"] == "failed":
            text = paint(text, RED)
        elif e["action"] in held_back:
            text = paint(text, YELLOW)
        elif e["action"].startswith(("probe", "baseline-")):
            text = paint(text, CYAN)
        out.append(text)
    return out


def _pick_jobs(jobs: Sequence[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """At most ``limit`` jobs, the ones that need a look first, shown in job-id order."""
    if len(jobs) <= limit:
        return list(jobs)
    ranked = sorted(
        jobs,
        key=lambda j: (not j["failed"], _row_colour(j) is None, j["job_id"]),
    )
    return sorted(ranked[:limit], key=lambda j: j["job_id"])


def render(
    doc: Mapping[str, Any],
    *,
    width: int,
    color: bool = False,
    max_job_rows: int | None = None,
    max_events: int = 10,
) -> str:
    """The whole screen. ``max_job_rows``: fit a screen of that many job rows (``--watch``),
    keeping failed, throttled and probing jobs; None lists every job."""
    paint = Paint(color)
    width = max(20, width)
    out: list[str] = []
    for p in doc["problems"]:
        out.append(paint(fit("! " + p, width), RED))
    if doc["missing"]:
        out.append(
            paint(
                fit(
                    "! state from another coda-node version: no "
                    + ", ".join(doc["missing"])
                    + " (shown as ? or -)",
                    width,
                ),
                YELLOW,
            )
        )
    if doc["daemon"]["status"] == "absent":
        return "\n".join(out)
    out += node_lines(doc, width, paint)
    out.append("")
    jobs = doc["jobs"]
    shown = jobs if max_job_rows is None else _pick_jobs(jobs, max(1, max_job_rows))
    if jobs:
        out += job_table(shown, width, paint)
        if len(shown) < len(jobs):
            out.append(
                fit(
                    f"... and {len(jobs) - len(shown)} more jobs (coda-node status lists all)",
                    width,
                )
            )
    else:
        out.append("(no jobs on this node)")
    for e in doc["node"]["errors"]:
        out.append(paint(fit(f"! {e}", width), RED))
    events = doc["events"][-max_events:] if max_events > 0 else []
    if events:
        out.append("")
        out.append(paint("recent events:", BOLD))
        out += event_lines(events, width, paint)
    return "\n".join(out)
