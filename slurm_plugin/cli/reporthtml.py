"""``coda-slurm report --html FILE``: the report as one self-contained page an admin can
forward. Inline CSS and SVG drawn here, no script and no fetch: the page's
Content-Security-Policy (``default-src 'none'``) keeps a browser from loading anything, so
it looks the same offline. Every number is the ``--json`` document's, printed by
:func:`slurm_plugin.cli.reporttext.fmt`; every name a user controls is escaped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from slurm_plugin.cli.reporttext import COLUMNS, fmt, fmt_pct, profiles_words, verdict

PLOT_ROWS = 15
"""Groups in the bar plot (the table below it has all of them)."""
PROBLEMS_SHOWN = 10
PLOT_W = 760
LABEL_W = 170

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;padding:0 16px;max-width:1100px}
body{color:#1a1a1a}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.verdict{font-size:16px;font-weight:600;margin:12px 0}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
#totals th{text-align:left;font-weight:normal;color:#444}
.gpu-hours{fill:#9db4d0}.gpu-hours-waiting,.day-waiting{fill:#d9534f}
svg text{font:12px system-ui,sans-serif;fill:#333}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
.muted{color:#666}code{font-size:12px}
"""

_TOTALS = (
    ("GPU jobs", "jobs"),
    ("GPU jobs whose GPUs waited (20% or more of the time)", "jobs_gpus_waited"),
    ("CPU jobs throttled", "cpu_jobs"),
    ("GPU-hours", "gpu_hours"),
    ("GPU-hours waiting on CPU", "gpu_hours_waiting"),
    ("Share of the measured GPU time waiting", "waiting_share_pct"),
    ("Core-hours held idle on GPU jobs", "idle_core_hours"),
    ("Cores coda added", "cores_added"),
    ("Cores coda returned", "cores_returned"),
    ("Core-hours added", "core_hours_added"),
    ("Core-hours returned", "core_hours_returned"),
    ("Jobs sized from a measured profile", "jobs_from_profile"),
    ("Jobs sized from a prior", "jobs_from_prior"),
    ("Jobs at the default (no profile)", "jobs_from_default"),
    ("Jobs without a coda record", "jobs_without_record"),
    ("Jobs whose baseline is unknown", "jobs_baseline_unknown"),
)


def _cell(key: str, value: Any) -> str:
    text = fmt_pct(value) if key == "waiting_share_pct" else fmt(value)
    return f'<td data-key="{key}">{escape(text)}</td>'


def totals_table(t: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{escape(label)}</th>{_cell(k, t[k])}</tr>" for label, k in _TOTALS)
    return f'<table id="totals">{rows}</table>'


def groups_table(rows: Sequence[Mapping[str, Any]], by: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h, _ in COLUMNS)
    body = "".join(
        f'<tr data-name="{escape(r["name"])}"><td>{escape(r["name"])}</td>'
        + "".join(_cell(k, r[k]) for _, k in COLUMNS)
        + "</tr>"
        for r in rows
    )
    return (
        f'<table id="groups"><thead><tr><th>{escape(by)}</th>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _bar(cls: str, x: float, y: float, w: float, h: float, name: str, value: float) -> str:
    return (
        f'<rect class="bar {cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.0):.1f}" '
        f'height="{h:.1f}" data-name="{escape(name)}" data-value="{fmt(value)}">'
        f"<title>{escape(name)}: {fmt(value)}</title></rect>"
    )


def groups_plot(rows: Sequence[Mapping[str, Any]]) -> str:
    """Horizontal bars: each group's GPU-hours and, below, its GPU-hours waiting."""
    shown = rows[:PLOT_ROWS]
    top = max((r["gpu_hours"] for r in shown), default=0.0) or 1.0
    span = PLOT_W - LABEL_W - 100
    row_h, height = 30, 30 * len(shown) + 10
    parts = []
    for i, r in enumerate(shown):
        y, name = 5 + i * row_h, r["name"]
        label = name if len(name) <= 24 else name[:23] + "~"
        parts.append(f'<text x="0" y="{y + 15}">{escape(label)}</text>')
        for j, (cls, key) in enumerate(
            (("gpu-hours", "gpu_hours"), ("gpu-hours-waiting", "gpu_hours_waiting"))
        ):
            w = span * r[key] / top
            parts.append(_bar(cls, LABEL_W, y + j * 11, w, 10, name, r[key]))
            parts.append(
                f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 9 + j * 11}">{fmt(r[key])}</text>'
            )
    return (
        f'<svg id="groups-plot" xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" '
        f'height="{height}" role="img" aria-label="GPU-hours and GPU-hours waiting per group">'
        + "".join(parts)
        + "</svg>"
    )


def daily_plot(days: Sequence[Mapping[str, Any]]) -> str:
    """Vertical bars: GPU-hours waiting on CPU per day (by the day jobs ended, UTC)."""
    height, base, left = 220, 190, 50
    top = max((d["gpu_hours_waiting"] for d in days), default=0.0) or 1.0
    step = (PLOT_W - left - 10) / max(len(days), 1)
    every = max(1, len(days) // 10)
    parts = [
        f'<line x1="{left}" y1="{base}" x2="{PLOT_W - 10}" y2="{base}" stroke="#999"/>',
        f'<text x="0" y="20">{fmt(top if top != 1.0 else 0.0)}</text>',
        f'<text x="0" y="{base}">0</text>',
    ]
    for i, d in enumerate(days):
        h = (base - 20) * d["gpu_hours_waiting"] / top
        x = left + i * step + step * 0.15
        bar = _bar("day-waiting", x, base - h, step * 0.7, h, d["day"], d["gpu_hours_waiting"])
        parts.append(bar.replace("data-name=", "data-day=", 1))
        if i % every == 0:
            parts.append(f'<text x="{x:.1f}" y="{base + 16}">{escape(d["day"][5:])}</text>')
    return (
        f'<svg id="daily-plot" xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" '
        f'height="{height}" role="img" aria-label="GPU-hours waiting on CPU per day">'
        + "".join(parts)
        + "</svg>"
    )


PROFILES_SHOWN = 50


def _profiles(p: Mapping[str, Any]) -> str:
    """The profiles updated in the window, newest first."""
    rows = "".join(
        f"<tr><td>{escape(x['workload'])}</td><td>{x['cpus_per_gpu']}</td>"
        f"<td>{escape(x['updated'])}</td><td>{escape(x['signature'])}</td></tr>"
        for x in p["profiles"][:PROFILES_SHOWN]
    )
    table = (
        '<table id="profiles"><thead><tr><th>workload</th><th>cores per GPU</th>'
        f"<th>updated</th><th>signature</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    return f"<p>{escape(profiles_words(p))}</p>" + (table if rows else "")


def _problems(p: Mapping[str, Any]) -> str:
    items = "".join(f"<li><code>{escape(x)}</code></li>" for x in p["first"][:PROBLEMS_SHOWN])
    return (
        f'<p id="problems" data-count="{p["count"]}">{p["count"]} summaries or files were '
        f"skipped (damaged or refused); the first {min(p['count'], PROBLEMS_SHOWN)}:</p>"
        f"<ul>{items}</ul>"
    )


def render_html(doc: Mapping[str, Any]) -> str:
    w, by = doc["window"], doc["by"]
    rows = doc["groups"][by]
    legend = (
        '<p class="legend"><span style="background:#9db4d0"></span>GPU-hours'
        '<span style="background:#d9534f"></span>GPU-hours waiting on CPU</p>'
    )
    body = [
        f'<h1>coda site report</h1><p class="muted">{escape(w["since"])} to '
        f"{escape(w['until'])} ({w['days']:g} days), {doc['summaries']} job summaries</p>",
        f'<p class="verdict">{escape(verdict(doc))}</p>',
        "<h2>Site</h2>",
        totals_table(doc["totals"]),
        f"<h2>GPU-hours and GPU-hours waiting by {escape(by)}</h2>",
        legend,
        groups_plot(rows),
        "<h2>GPU-hours waiting on CPU per day (UTC, by the day jobs ended)</h2>",
        daily_plot(doc["daily"]),
        f"<h2>By {escape(by)}</h2>",
        groups_table(rows, by),
        "<h2>Profiles changed in the window</h2>",
        _profiles(doc["profiles_changed"]),
        "<h2>Skipped</h2>",
        _problems(doc["problems"]),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>coda site report {escape(w['since'])} to {escape(w['until'])}</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
