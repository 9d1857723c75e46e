"""What ``coda-node status`` shows: the daemon's view, read from its view file and put in
one documented shape (``docs/status.schema.json``) for the screen, ``--json`` and the
Prometheus exporter (:mod:`coda_node.status.metrics`) alike.

Nothing here decides anything or reads the node: the numbers are the daemon's, from its
last tick ("it reads the daemon's state; it does not recompute"). This module only
renames, counts (cores in a cpulist, GPUs of a job) and joins (a job's last event, the jobs
on each GPU). A view from another coda-node version is shown as far as it goes; the fields
it lacks are listed in ``missing`` rather than raising.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from coda_node.enforce.mechanisms import registered
from coda_node.enforce.state import FORMAT as STATE_FORMAT
from coda_node.enforce.state import VIEW_FORMAT
from coda_node.enforce.state import VIEW_FORMAT_VERSION as FORMAT_VERSION
from coda_node.system.cpulist import parse_cpulist

STATUS_SCHEMA_VERSION = 1
"""Version of the ``--json`` document; bumped on any change that is not an addition."""

STALE_INTERVALS = 3
"""A view older than this many daemon intervals means the daemon stopped ticking."""

PROFILE_STATES = ("known", "waiting", "probing", "probed", "confident", "skipped")
"""``known``: the workload had a confident profile at submit time; ``waiting``: will be
probed when it trains (or was paused); ``probing``: runs on fewer cores now; ``probed``:
probing ended without a confident profile; ``confident``: probing published a confident
profile; ``skipped``: not profiled (why in ``profile.why``)."""

DAEMON_STATES = ("running", "stale", "stopped", "absent")


class StatusUnavailable(RuntimeError):
    """The daemon's view cannot be read; ``str()`` is a sentence an admin can act on."""


# -- the event vocabulary ---------------------------------------------------------------


def _enforcer_actions() -> tuple[tuple[str, str], ...]:
    """(prefix of the enforcer's line, action), the most specific prefix first: a failed
    write, then each mechanism's own (coda_node.enforce.mechanisms)."""
    return (("failed: ", "failed"), *(e for kind in registered() for e in kind.events))


def write_actions() -> frozenset[str]:
    """Events that record a change written (or a write that failed), not a decision."""
    return frozenset(action for _, action in _enforcer_actions())


THROTTLE_ACTIONS = frozenset({"throttle", "throttle-correct"})
"""The contention eliminator's events that hold a job back."""
RELEASE_SUFFIXES = ("-release", "-restore")
"""How a mechanism's action that undoes a limit ends (its ``events``)."""


def throttle_actions() -> frozenset[str]:
    """Events that hold a job back: the eliminator's throttles, and the limits set by each
    mechanism that ``throttles`` (not its releases)."""
    return THROTTLE_ACTIONS | {
        action
        for kind in registered()
        if kind.throttles
        for _, action in kind.events
        if not action.endswith(RELEASE_SUFFIXES)
    }


def event_action(what: str) -> str:
    """The action of an event, from a small fixed vocabulary (a Prometheus label).

    The adaptive loop's events are already one word (``throttle``, ``probe-done``); the
    enforcer's say what they wrote (``cpuset 0-3``, ``cpu quota 2.5 cores``) and map to
    their mechanism's actions (``cpuset``, ``quota``, ``mem-bw``, ``l3`` for CAT ways, their
    ``-restore``/``-release``: each mechanism's ``events``) or ``failed``.
    """
    for prefix, action in _enforcer_actions():
        if what.startswith(prefix):
            return action
    return what if what and " " not in what else "other"


# -- reading the view file ----------------------------------------------------------------


def _read_json(path: Path, fmt: str, what: str) -> dict[str, Any]:
    """The JSON of the coda-node file at ``path`` (``format`` ``fmt``); raises
    :class:`StatusUnavailable` saying what to do (FileNotFoundError propagates)."""
    try:
        raw = path.read_bytes()
    except PermissionError:
        raise StatusUnavailable(
            f"cannot read {path} (permission denied): run as root, or make the {what} "
            "readable (chmod a+r)"
        ) from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StatusUnavailable(f"cannot read {path} ({exc.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        raise StatusUnavailable(f"{path} is not a coda-node {what} ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise StatusUnavailable(f"{path} is not a coda-node {what} (no format={fmt})")
    return data


def read_view(view_path: Path, state_path: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """(the file read, its JSON): the daemon's view file; where there is none, the state
    file at ``state_path`` when it holds a view (a coda-node from before the view had its
    own file still runs). Raises :class:`StatusUnavailable` saying what to do."""
    try:
        return view_path, _read_json(view_path, VIEW_FORMAT, "view file")
    except FileNotFoundError:
        pass
    if state_path is not None:
        try:
            data = _read_json(state_path, STATE_FORMAT, "state file")
        except FileNotFoundError:
            pass
        else:
            if "view" in data:
                return state_path, data
    raise StatusUnavailable(
        f"coda-node daemon is not running on this node (no view at {view_path})"
    )


def load_status(
    view_path: Path,
    *,
    interval_s: float,
    state_path: Path | None = None,
    now_unix_s: float | None = None,
) -> dict[str, Any]:
    """The status document of the daemon's view file at ``view_path`` (NodeRuntimeDir/
    view.json; see :func:`read_view` for ``state_path``); never raises: a file that cannot
    be read gives a document with ``daemon.status`` ``absent`` and the reason in
    ``problems``. ``interval_s``: NodeIntervalS, for a view that does not carry it."""
    now = time.time() if now_unix_s is None else now_unix_s
    try:
        path, data = read_view(view_path, state_path)
    except StatusUnavailable as exc:
        return build_status(
            None,
            state_path=view_path,
            written_unix_s=None,
            format_version=None,
            now_unix_s=now,
            interval_s=interval_s,
            problem=str(exc),
        )
    view = data.get("view")
    return build_status(
        view if view is not None else {},
        state_path=path,
        written_unix_s=data.get("written_unix_s"),
        # A state file's format is that of its record of changes; its view is as the first
        # view file's.
        format_version=data.get("format_version") if path == view_path else FORMAT_VERSION,
        now_unix_s=now,
        interval_s=interval_s,
    )


# -- field access that survives another version's view --------------------------------------


class _Fields:
    """Typed access to a view dict; a key absent or of the wrong type is recorded."""

    def __init__(self) -> None:
        self.missing: set[str] = set()

    def get(self, d: object, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(d, Mapping) or key not in d:
            self.missing.add(f"{where}{key}")
            return None
        value = d[key]
        if value is None:
            return None
        if not _is(value, kind):
            self.missing.add(f"{where}{key}")
            return None
        return value

    def opt(self, d: object, key: str, kind: type | tuple[type, ...]) -> Any:
        """A key older views may lack and that nothing depends on: never recorded."""
        if not isinstance(d, Mapping):
            return None
        value = d.get(key)
        return value if value is not None and _is(value, kind) else None


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, kinds)


NUMBER = (int, float)


def _cpulist_count(text: str | None) -> int | None:
    """Number of CPUs in a cpulist (``0-3,8`` -> 5); None when absent or unreadable."""
    if text is None:
        return None
    try:
        return len(parse_cpulist(text))
    except ValueError:
        return None


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


# -- the document ---------------------------------------------------------------------------


def build_status(
    view: Mapping[str, Any] | None,
    *,
    state_path: Path | str,
    written_unix_s: float | None,
    format_version: object,
    now_unix_s: float,
    interval_s: float,
    problem: str | None = None,
) -> dict[str, Any]:
    """The status document (``docs/status.schema.json``) of one daemon view.

    ``view`` is the daemon's ``state.view`` (None when there is no state at all, with
    ``problem`` saying why); ``interval_s`` is NodeIntervalS from coda.conf, used only
    when the view does not carry the daemon's own.
    """
    f = _Fields()
    problems: list[str] = [problem] if problem else []
    if view is not None and not isinstance(view, Mapping):
        problems.append("the daemon's view is not an object")
        view = None
    daemon_in = f.get(view, "daemon", dict, "") if view is not None else None
    node_in = f.get(view, "node", dict, "") if view is not None else None
    view_interval = f.get(daemon_in, "interval_s", NUMBER, "daemon.") if daemon_in else None
    used_interval_s = float(view_interval) if view_interval else float(interval_s)
    stale_after_s = STALE_INTERVALS * used_interval_s
    age_s = None
    if _is(written_unix_s, NUMBER):
        age_s = max(0.0, now_unix_s - float(written_unix_s))  # type: ignore[arg-type]
    status = _daemon_state(
        view, daemon_in, problems, state_path, written_unix_s, age_s, used_interval_s
    )
    if format_version is not None and format_version != FORMAT_VERSION:
        problems.append(
            f"view format {format_version} (this coda-node reads {FORMAT_VERSION}): shown as "
            "far as it goes"
        )
    daemon = _daemon(f, view, daemon_in, status, used_interval_s)

    jobs, events, node = _jobs_events_node(f, view, node_in)
    return {
        "schema_version": STATUS_SCHEMA_VERSION,
        "state": {
            "path": str(state_path),
            "format_version": format_version if _is(format_version, int) else None,
            "written_unix_s": float(written_unix_s) if _is(written_unix_s, NUMBER) else None,  # type: ignore[arg-type]
            "age_s": age_s,
            "stale_after_s": stale_after_s,
        },
        "daemon": daemon,
        "node": node,
        "jobs": jobs,
        "events": events,
        "problems": problems,
        "missing": sorted(f.missing),
    }


def _jobs_events_node(
    f: _Fields, view: Mapping[str, Any] | None, node_in: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The jobs (each with its last decision), the events and the node of a view."""
    raw_jobs = f.get(view, "jobs", list, "") if view is not None else None
    jobs_in = [j for j in raw_jobs or [] if isinstance(j, Mapping) and _is(j.get("job_id"), int)]
    raw_events = f.get(view, "events", list, "") if view is not None else None
    events = [_event(e, f) for e in raw_events or [] if isinstance(e, Mapping)]
    events = [e for e in events if e is not None]
    last_event = _last_decisions(events)

    jobs = [_job(j, f, last_event.get(int(j["job_id"]))) for j in jobs_in]
    jobs.sort(key=lambda j: j["job_id"])
    node = _node(node_in, f, jobs_in) if view is not None else _empty_node()
    return jobs, events, node


def _daemon_state(
    view: Mapping[str, Any] | None,
    daemon_in: Mapping[str, Any] | None,
    problems: list[str],
    state_path: Path | str,
    written_unix_s: float | None,
    age_s: float | None,
    interval_s: float,
) -> str:
    """One of DAEMON_STATES for the view; a daemon not running adds why to ``problems``."""
    if view is None:
        return "absent"
    if daemon_in is not None and daemon_in.get("running") is False:
        problems.append(
            f"the daemon stopped (it put every job back) at {local_time(written_unix_s)}; "
            "start it with: systemctl start coda-node"
        )
        return "stopped"
    if age_s is None or age_s > STALE_INTERVALS * interval_s:
        problems.append(
            f"view at {state_path} is {age_s:.0f} s old: the daemon seems stopped (last tick "
            f"at {local_time(written_unix_s)}; it ticks every {interval_s:g} s)"
            if age_s is not None
            else f"view at {state_path} has no time: the daemon seems stopped"
        )
        return "stale"
    return "running"


def _daemon(
    f: _Fields,
    view: Mapping[str, Any] | None,
    daemon_in: Mapping[str, Any] | None,
    status: str,
    interval_s: float,
) -> dict[str, Any]:
    """The document's ``daemon`` object: the view's daemon entry and its counters."""
    counters = f.opt(daemon_in, "counters", dict) or {}
    daemon = {
        "status": status,
        "pid": f.get(daemon_in, "pid", int, "daemon.") if daemon_in else None,
        "version": f.get(daemon_in, "version", str, "daemon.") if daemon_in else None,
        "node_name": f.get(daemon_in, "node_name", str, "daemon.") if daemon_in else None,
        "started_unix_s": f.opt(daemon_in, "started_unix_s", NUMBER),
        "interval_s": interval_s,
        "enforce": [str(x) for x in (f.opt(daemon_in, "enforce", list) or [])],
        "profiling": f.get(daemon_in, "profiling", str, "daemon.") if daemon_in else None,
        "contention": f.get(daemon_in, "contention", str, "daemon.") if daemon_in else None,
        "metrics": f.opt(daemon_in, "metrics", str),
        "ticks_total": f.opt(counters, "ticks_total", int),
        "tick_errors_total": f.opt(counters, "tick_errors_total", int),
        "events_total": {
            str(k): int(v)
            for k, v in (f.opt(counters, "events_total", dict) or {}).items()
            if _is(v, int)
        },
        "tick_cpu_s": f.opt(view, "tick_cpu_s", NUMBER),
    }
    if view is not None and daemon_in is not None and "counters" not in daemon_in:
        f.missing.add("daemon.counters")
    return daemon


def local_time(unix_s: object, fmt: str = "%Y-%m-%d %H:%M:%S", unknown: str = "?") -> str:
    """``unix_s`` as local time in ``fmt``; ``unknown`` for no number or one beyond the
    platform's calendar."""
    if not _is(unix_s, NUMBER):
        return unknown
    try:
        return time.strftime(fmt, time.localtime(float(unix_s)))  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError):
        return unknown


def _empty_node() -> dict[str, Any]:
    return {
        "cores": None,
        "cgroup_version": None,
        "gpus": [],
        "nvml": None,
        "mem_bw": [],
        "mem_bw_unavailable": None,
        "pcie_bw": [],
        "capabilities": [],
        "errors": [],
    }


def _node(node: Any, f: _Fields, jobs_in: list[Mapping[str, Any]]) -> dict[str, Any]:
    out = _empty_node()
    if node is None:
        return out
    out["cores"] = f.get(node, "cpus_online", int, "node.")
    out["cgroup_version"] = f.opt(node, "cgroup_version", int)
    jobs_on: dict[int, list[int]] = {}
    for j in jobs_in:
        for g in j.get("gpus") if isinstance(j.get("gpus"), list) else []:
            if isinstance(g, Mapping) and _is(g.get("nvml_index"), int):
                jobs_on.setdefault(g["nvml_index"], []).append(int(j["job_id"]))
    gpus = []
    for g in f.get(node, "gpus", list, "node.") or []:
        if not isinstance(g, Mapping) or not _is(g.get("index"), int):
            continue
        gpus.append(
            {
                "index": g["index"],
                "name": f.opt(g, "name", str),
                "util_pct": f.opt(g, "util_pct", NUMBER),
                "mem_used_bytes": f.opt(g, "mem_used_bytes", int),
                "mem_total_bytes": f.opt(g, "mem_total_bytes", int),
                "pcie_rx_bytes_per_s": f.opt(g, "pcie_rx_bytes_per_s", NUMBER),
                "pcie_tx_bytes_per_s": f.opt(g, "pcie_tx_bytes_per_s", NUMBER),
                "job_ids": sorted(jobs_on.get(g["index"], [])),
            }
        )
    out["gpus"] = gpus
    nvml = f.opt(node, "nvml", dict)
    if nvml is not None:
        out["nvml"] = {
            "available": bool(nvml.get("available")),
            "detail": str(nvml.get("detail") or ""),
        }
    out["mem_bw"] = _per_socket(f, f.get(node, "mem_bw", list, "node."), "read", "write")
    # opt: views written before the daemon sampled the IIO counters have no pcie_bw.
    out["pcie_bw"] = _per_socket(f, f.opt(node, "pcie_bw", list), "in", "out")
    caps = []
    for c in f.get(node, "capabilities", list, "node.") or []:
        if isinstance(c, Mapping) and isinstance(c.get("name"), str):
            caps.append(
                {
                    "name": c["name"],
                    "available": bool(c.get("available")),
                    "detail": str(c.get("detail") or ""),
                }
            )
    out["capabilities"] = caps
    if not out["mem_bw"]:
        uncore = next((c for c in caps if c["name"] == "uncore memory bandwidth"), None)
        if uncore is not None and not uncore["available"]:
            out["mem_bw_unavailable"] = uncore["detail"]
        elif uncore is None:
            out["mem_bw_unavailable"] = "not measured"
    out["errors"] = [str(e) for e in f.get(node, "errors", list, "node.") or []]
    return out


def _per_socket(f: _Fields, samples: list[Any] | None, a: str, b: str) -> list[dict[str, Any]]:
    """Per-socket rates (``<a>_bytes_per_s``, ``<b>_bytes_per_s`` and their sum), sorted by
    socket; entries without an integer socket are left out."""
    out = []
    for m in samples or []:
        if not isinstance(m, Mapping) or not _is(m.get("socket"), int):
            continue
        first, second = f.opt(m, f"{a}_bytes_per_s", NUMBER), f.opt(m, f"{b}_bytes_per_s", NUMBER)
        both = first + second if first is not None and second is not None else None
        out.append(
            {
                "socket": m["socket"],
                f"{a}_bytes_per_s": first,
                f"{b}_bytes_per_s": second,
                "bytes_per_s": both,
            }
        )
    return sorted(out, key=lambda m: m["socket"])


def _event(e: Mapping[str, Any], f: _Fields) -> dict[str, Any] | None:
    if not _is(e.get("job_id"), int):
        return None
    what = f.get(e, "what", str, "events[].") or ""
    action = f.opt(e, "action", str) or event_action(what)
    return {
        "unix_s": f.get(e, "unix_s", NUMBER, "events[]."),
        "tick": f.opt(e, "tick", int),
        "job_id": e["job_id"],
        "action": action,
        "what": what,
        "reason": f.get(e, "reason", str, "events[].") or "",
    }


def _last_decisions(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each job's last decision: of the events of its latest tick with any, the last that
    is a decision (``throttle`` says why; the ``mem-bw`` write it caused does not), else
    the last write (an admin limit's write carries the limit's reason)."""
    last: dict[int, dict[str, Any]] = {}
    writes = write_actions()
    for e in events:
        prev = last.get(e["job_id"])
        same_tick = prev is not None and e["tick"] is not None and e["tick"] == prev["tick"]
        if same_tick and e["action"] in writes and prev["action"] not in writes:
            continue
        last[e["job_id"]] = e
    return last


def _profile_state(j: Mapping[str, Any], profiling: Mapping[str, Any] | None) -> str | None:
    """The daemon's ``profile_state``; for an older view, derived from its record."""
    state = j.get("profile_state")
    if isinstance(state, str) and state in PROFILE_STATES:
        return state
    if profiling is None:
        return None
    rec = profiling.get("state")
    if rec == "done":
        return "known" if not profiling.get("probes") else "probed"
    return rec if rec in PROFILE_STATES else None


def _job(j: Mapping[str, Any], f: _Fields, last: dict[str, Any] | None) -> dict[str, Any]:
    w = "jobs[]."
    gpus_in = [g for g in f.get(j, "gpus", list, w) or [] if isinstance(g, Mapping)]
    gpu_idx = [g["slurm_index"] for g in gpus_in if _is(g.get("slurm_index"), int)]
    gpu_util = _mean(g.get("util_pct") for g in gpus_in if _is(g.get("util_pct"), NUMBER))
    cpus_allocated = f.get(j, "cpus_allocated", str, w)
    cpus_now = f.get(j, "cpus_now", str, w)
    cores_now = _cpulist_count(cpus_now)
    quota = f.get(j, "quota_cores", NUMBER, w)
    in_force: float | None = cores_now
    if quota is not None and (in_force is None or quota < in_force):
        in_force = float(quota)
    predicted = _predicted_cores(f.get(j, "hook_record", dict, w), len(gpu_idx))
    progress_in = f.get(j, "progress", dict, w)
    progress = None
    if progress_in is not None:
        progress = {
            "phase": str(progress_in.get("phase") or "?"),
            "rate": f.opt(progress_in, "rate", NUMBER),
            "source": f.opt(progress_in, "source", str),
        }
    profiling = f.get(j, "profiling", dict, w)
    profile_state = _profile_state(j, profiling)
    profile = _profile(f, profiling)
    contention = f.get(j, "contention", dict, w)
    throttle = _throttle(f, contention)
    slowdown = None
    if contention is not None and "slowdown" in contention:
        slowdown = f.opt(contention, "slowdown", NUMBER)
    limit = _limit(f, f.get(j, "limit", dict, w))
    failed = [str(x) for x in f.get(j, "last_failed", list, w) or []]
    decision = _decision(last, f.get(j, "target_reason", str, w))
    kind = f.get(j, "kind", str, w)
    return {
        "job_id": j["job_id"],
        "user": f.get(j, "user", str, w),
        "name": f.opt(j, "name", str),
        "kind": kind if kind in ("dnn", "cpu") else "unknown",
        "gpus": gpu_idx,
        "gpu_util_pct": gpu_util,
        "cpus_allocated": cpus_allocated,
        "cpus_now": cpus_now,
        "cores_allocated": _cpulist_count(cpus_allocated),
        "cores_predicted": predicted,
        "cores_now": cores_now,
        "quota_cores": quota,
        "cores_in_force": in_force,
        "cpu_rate_cores": f.get(j, "cpu_rate_cores", NUMBER, w),
        "mem_bw_bytes_per_s": f.get(j, "mem_bw_bytes_per_s", NUMBER, w),
        "pcie_bytes_per_s": f.opt(j, "pcie_bytes_per_s", NUMBER),
        "progress": progress,
        "slowdown": slowdown,
        "throttle_level": throttle["level"] if throttle else 0,
        "throttle": throttle,
        "limit": limit,
        "profile_state": profile_state,
        "profile": profile,
        "last_decision": decision,
        "failed": failed,
    }


def _predicted_cores(record: Mapping[str, Any] | None, n_gpus: int) -> int | None:
    """The cores the hook predicted: its CPUs per GPU times the job's GPUs (those the view
    lists, else the record's GPUs per node); None without a readable record."""
    if record is None:
        return None
    try:
        cpg = int(str(record.get("cpg") or ""))
    except ValueError:
        return None
    if not n_gpus:
        try:
            n_gpus = int(str(record.get("gpn") or "0"))
        except ValueError:
            n_gpus = 0
    return cpg * n_gpus if n_gpus else None


def _profile(f: _Fields, profiling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if profiling is None:
        return None
    return {
        "why": str(profiling.get("why") or ""),
        "cores_now": f.opt(profiling, "cores_now", int),
        "probes": f.opt(profiling, "probes", int),
        "sweet_spot_cores": f.opt(profiling, "sweet_spot_cores", int),
        "confidence": f.opt(profiling, "confidence", NUMBER),
    }


def _throttle(f: _Fields, contention: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if contention is None or "level" not in contention:
        return None
    return {
        "level": f.opt(contention, "level", int) or 0,
        "mechanism": f.opt(contention, "mechanism", str),
        "mem_bw_pct": f.opt(contention, "mem_bw_pct", int),
        "l3_ways": f.opt(contention, "l3_ways", int),
        "l3_ways_total": f.opt(contention, "l3_ways_total", int),
        "quota_cores": f.opt(contention, "quota_cores", NUMBER),
        "for_job": f.opt(contention, "for_job", int),
    }


def _limit(f: _Fields, limit_in: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if limit_in is None:
        return None
    cpus = f.opt(limit_in, "cpus", list)
    return {
        "cores": f.opt(limit_in, "cores", int),
        "cpus": [c for c in cpus if _is(c, int)] if cpus is not None else None,
        "quota_cores": f.opt(limit_in, "quota_cores", NUMBER),
        "mem_bw_pct": f.opt(limit_in, "mem_bw_pct", int),
        "extra": _extra_limits(f.opt(limit_in, "extra", Mapping)),
        "reason": str(limit_in.get("reason") or ""),
    }


def _extra_limits(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The limits of mechanisms the fixed fields do not name, by mechanism (JSON values
    as the limits file holds them); an older view has none."""
    return {str(name): value for name, value in (extra or {}).items()}


def _decision(last: dict[str, Any] | None, target_reason: str | None) -> dict[str, Any] | None:
    """The job's last event, else the reason of its target (an older view's only trace)."""
    if last is not None:
        return {"unix_s": last["unix_s"], "action": last["action"], "reason": last["reason"]}
    if target_reason:
        return {"unix_s": None, "action": "target", "reason": target_reason}
    return None
