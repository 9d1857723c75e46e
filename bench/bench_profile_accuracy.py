"""Where CODA's DNN jobs lose time against the oracle in the simulator, and why.

Runs the simulator's own code (``slurm_plugin.sim.engine``: the submit hook's
``decide()``, coda-node's allocator through ``probe_run``, ``refit_profile``, the
eliminator) on a trace prefix under the ``coda`` and ``oracle`` policies, with the same
setup as ``coda-slurm simulate``. The engine (``_Sim``) is subclassed, and the methods of
the rooms it builds are wrapped on the run's own instances, only to *record*: the profile
each GPU job's decision saw at submission (``_Sim._need``), which jobs were probed
(``OnlineProfiling._start_probe``), and every interval of each DNN job's progress rate
(``Rates.resolve``, ``_Sim._finish``). Nothing it decides is changed. A third run, ``coda``
with perfect profiles (``OnlineProfiling.coda_cores`` gives every GPU job its true sweet
spot, the oracle's cores; ``OnlineProfiling.probe_begin`` probes nothing; the eliminator as
in ``coda``), bounds what better profiles could gain. When a hooked method is gone from the
simulator the script stops with :class:`HookMissing` rather than record nothing.

It reports, for the ``coda`` run:

* published cores per GPU over the true sweet spot per GPU (θ), per workload class and GPU
  count, at each job's submission (the profile the hook used);
* the share of GPU-job run time (GPU-hours) spent below 90 % of the job's plateau rate, by
  cause: ``first run`` (no profile: the node's share), ``unconfident`` (a profile under
  MinConfidence), ``censored``, ``low fit`` (a confident profile below θ), ``multi-node``,
  ``node cap`` (θ above the node: the oracle is capped too), ``throttled`` (memory
  contention with enough cores);
* the mean-JCT gap to the oracle split into waiting and running, and the running part by
  cause (cores below θ by the cause above, probes, contention and the rest);
* core-hours GPU jobs held above their sweet spot (they can keep other jobs waiting).

    .venv/bin/python bench/bench_profile_accuracy.py philly --jobs 5000 --load 0.8 --cpu-load 0.3
    .venv/bin/python bench/bench_profile_accuracy.py muri --load 0.8 --cpu-load 0.3
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from coda_common.model.curves import throughput_at
from coda_common.model.fit import is_censored
from slurm_plugin.sim.cluster import add_cpu_jobs, size_for_load
from slurm_plugin.sim.engine import CODA_CONF, POLICIES, SimParams, _Sim
from slurm_plugin.sim.nodes import Need
from slurm_plugin.sim.profiling import OnlineProfiling
from slurm_plugin.sim.rates import Rates
from slurm_plugin.sim.traces import (
    ALIBABA_PODS,
    MURI_CSV,
    NodeSpec,
    Trace,
    TraceError,
    load_alibaba,
    load_trace,
    muri_stage_times,
    trace_file,
)
from slurm_plugin.sim.workloads import (
    CLASSES,
    JobModel,
    Workloads,
    assign_workloads,
    muri_classes,
)

_SLOW = 0.9
"""A job runs "slow" below this share of its plateau rate."""

_SIM_OVERRIDES = ("_need", "_finish")
"""The engine's methods :class:`_Recorder` overrides: a subclass method the engine no longer
calls would record nothing, silently."""
_SIM_READS = ("_theta", "_gpn_nodes", "_user_cores")
"""The engine's methods the report reads."""
_ROOM_HOOKS: tuple[tuple[type, str], ...] = (
    (OnlineProfiling, "coda_cores"),
    (OnlineProfiling, "probe_begin"),
    (OnlineProfiling, "_start_probe"),
    (OnlineProfiling, "_signature"),
    (Rates, "resolve"),
)
"""The rooms' methods the recorder wraps on the engine's own instances (or reads)."""


class HookMissing(RuntimeError):
    """The simulator no longer has a method this bench hooks: it would record nothing."""


def check_hooks() -> None:
    """Raise :class:`HookMissing` naming every hooked method the simulator no longer has."""
    wanted = [(_Sim, name) for name in (*_SIM_OVERRIDES, *_SIM_READS)] + list(_ROOM_HOOKS)
    gone = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls, name in wanted
        if not callable(getattr(cls, name, None))
    ]
    if gone:
        raise HookMissing(
            "bench_profile_accuracy hooks simulator methods that are gone: "
            + ", ".join(gone)
            + "; re-hook _Recorder to today's engine (unhooked, it would record nothing)"
        )


def _wrap(room: object, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``room.name`` on this instance by ``make(the bound original)``."""
    if not callable(getattr(type(room), name, None)):
        raise HookMissing(
            f"{type(room).__module__}.{type(room).__qualname__}.{name} is gone: "
            "re-hook _Recorder to today's engine (unhooked, it would record nothing)"
        )
    setattr(room, name, make(getattr(room, name)))


class _Recorder(_Sim):
    """The engine, recording what each GPU job saw and how fast it ran. It wraps the
    engine's rooms on its own instances (the hook's decision and probe slots in
    ``self.profiling``, the progress rates in ``self.rates``) and decides nothing itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_hooks()
        super().__init__(*args, **kwargs)
        self.seen: dict[int, tuple[str, float | None]] = {}
        """job -> (profile state at submission, published cores per GPU or None)."""
        self.slow_s: dict[int, float] = defaultdict(float)
        """job -> seconds run below _SLOW of its plateau rate."""
        self.mark: dict[int, tuple[float, float]] = {}
        """job -> (since, rate) of its current interval."""
        self.probed: set[int] = set()
        """Jobs coda-node's allocator probed."""
        _wrap(self.profiling, "_start_probe", self._recording_probe)
        _wrap(self.rates, "resolve", self._recording_resolve)

    def _need(self, j: int) -> Need:
        need = super()._need(j)
        if need[0] and self.pol.cores == "coda":
            prof = self.profiles.get(self.profiling._signature(int(self.wl.workload[j])))
            if prof is None:
                self.seen[j] = ("none", None)
            elif prof.confidence < self.cfg.min_confidence:
                self.seen[j] = ("unconfident", float(prof.cpus_per_gpu))
            elif is_censored(prof):
                self.seen[j] = ("censored", float(prof.cpus_per_gpu))
            else:
                self.seen[j] = ("confident", float(prof.cpus_per_gpu))
        return need

    def _recording_probe(self, start_probe: Callable[..., None]) -> Callable[..., None]:
        def hooked(j: int, run: Any, now: float) -> None:
            self.probed.add(j)
            start_probe(j, run, now)

        return hooked

    def _recording_resolve(self, resolve: Callable[[float], None]) -> Callable[[float], None]:
        def hooked(now: float) -> None:
            nd = self.nodes
            touched = {j for i in self.rates.dirty for j in nd.on_node[i] if nd.running[j].gpu}
            resolve(now)
            for j in touched:
                rate = nd.running[j].rate
                old = self.mark.get(j)
                if old is None or old[1] != rate:
                    self._close_interval(j, now)
                    self.mark[j] = (now, rate)

        return hooked

    def _close_interval(self, j: int, now: float) -> None:
        since, rate = self.mark.get(j, (now, 1.0))
        if rate < _SLOW:
            self.slow_s[j] += now - since

    def _finish(self, j: int, now: float) -> None:
        if j in self.mark:
            self._close_interval(j, now)
            del self.mark[j]
        super()._finish(j, now)

    def check_recorded(self) -> None:
        """After :meth:`run`: every probe the engine counted was recorded."""
        if len(self.probed) != self.counters["probed_jobs"]:
            raise HookMissing(
                f"the engine probed {self.counters['probed_jobs']} jobs, the recorder saw "
                f"{len(self.probed)}: a probe path bypasses OnlineProfiling._start_probe"
            )


class _PerfectProfiles(_Recorder):
    """``coda`` with every GPU job given its true sweet spot (the oracle's cores) and no
    probing: the eliminator and everything else as in ``coda``. The JCT it reaches is what
    perfect profiles could give; the rest of the gap to the oracle is not the profiles'."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _wrap(self.profiling, "coda_cores", lambda _: self._true_cores)
        _wrap(self.profiling, "probe_begin", lambda _: self._no_probe)

    def _true_cores(self, j: int, gpn: int, k: int) -> int:
        return self._best_cores(j, gpn, k)

    def _no_probe(self, j: int, now: float) -> None:
        """A job past its warm-up is not probed (nor waits for a probe slot)."""
        return


def _setup(
    spec: str, jobs: int | None, load: float, cpu_load: float, seed: int
) -> tuple[Trace, list[NodeSpec], Workloads, JobModel]:
    """The trace, nodes, workloads and model exactly as ``coda-slurm simulate`` builds them."""
    model = JobModel()
    trace = load_trace(spec)
    if jobs is not None:
        trace = trace.head(jobs)
    nodes = size_for_load(trace, load)
    if cpu_load > 0:
        pods = trace_file(ALIBABA_PODS)
        try:
            donor = load_alibaba(pods) if pods is not None else None
        except (OSError, TraceError):
            donor = None
        trace = add_cpu_jobs(trace, nodes, cpu_load, seed=seed, donor=donor)
    named = None
    if trace.name.startswith("muri"):
        named = muri_classes(muri_stage_times(trace_file(MURI_CSV) or MURI_CSV), model)
    wl = assign_workloads(trace, model, seed, named_classes=named)
    return trace, nodes, wl, model


def _class_name(wl: object, wid: int) -> str:
    k = int(wl.klass[wid])  # type: ignore[attr-defined]
    if k < len(CLASSES):
        return CLASSES[k].name
    return wl.names[wid]  # type: ignore[attr-defined]


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def run_all(
    trace: Trace, nodes: list[NodeSpec], wl: Workloads, model: JobModel, params: SimParams
) -> dict[str, _Recorder]:
    """The ``coda``, ``oracle`` and ``perfect`` (coda with perfect profiles) runs, recorded."""
    sims: dict[str, _Recorder] = {}
    for name, cls in (("coda", _Recorder), ("oracle", _Recorder), ("perfect", _PerfectProfiles)):
        pol = POLICIES["oracle" if name == "oracle" else "coda"]
        sim = cls(trace, nodes, wl, model, pol, params, None)
        sim.run()
        sim.check_recorded()
        sims[name] = sim
    if sims["perfect"].counters["probed_jobs"]:
        raise HookMissing("the perfect-profiles run probed jobs: probe_begin is not hooked")
    return sims


def _report_ratios(coda: _Recorder, wl: Workloads, done: list[int]) -> None:
    """Published cores per GPU vs the true sweet spot, per class and GPU count."""
    ratios: dict[tuple[str, int], list[float]] = defaultdict(list)
    for j in done:
        cpg = coda.seen.get(j, ("none", None))[1]
        gpn, k = coda._gpn_nodes(j)
        if cpg is None or k > 1:
            continue
        theta_per_gpu = coda._theta(j, gpn, 1) / gpn
        ratios[(_class_name(wl, int(wl.workload[j])), gpn)].append(cpg / theta_per_gpu)
    print("\npublished cores per GPU / true θ per GPU, single-node jobs that saw a profile")
    print(f"{'class':<14} {'GPUs':>4} {'jobs':>6} {'p10':>6} {'p50':>6} {'p90':>6} {'<0.9':>6}")
    for (cls, gpn), vals in sorted(ratios.items()):
        v = np.asarray(vals)
        p10, p50, p90 = np.percentile(v, [10, 50, 90])
        low = _pct(float(np.mean(v < 0.9)))
        print(f"{cls:<14} {gpn:>4} {v.size:>6} {p10:6.2f} {p50:6.2f} {p90:6.2f} {low}")


def _slow_cause(coda: _Recorder, j: int, theta: float, k: int, base: float) -> str:
    """Why job ``j`` ran below _SLOW of its plateau at ``base`` (its curve at its cores)."""
    if base >= _SLOW:
        return "throttled"
    if theta > coda.nodes.max_cores:
        return "node cap"
    if k > 1:
        return "multi-node"
    state = coda.seen.get(j, ("none", None))[0]
    return {"none": "first run", "unconfident": "unconfident", "censored": "censored"}.get(
        state, "low fit"
    )


def _slow_and_gap(
    sims: dict[str, _Recorder], wl: Workloads, model: JobModel, done: list[int]
) -> tuple[dict[str, float], dict[str, float], float]:
    """GPU-seconds below _SLOW by cause, the running-time gap to the oracle by cause (job
    seconds), and all GPU-job GPU-seconds, for the ``coda`` run."""
    coda, oracle = sims["coda"], sims["oracle"]
    total_gpu_s = 0.0
    slow_by: dict[str, float] = defaultdict(float)
    gap_run: dict[str, float] = defaultdict(float)
    for j in done:
        gpn, k = coda._gpn_nodes(j)
        run_s = float(coda.end_s[j] - coda.start_s[j])
        total_gpu_s += gpn * k * run_s
        theta = coda._theta(j, gpn, k)
        cores = int(coda.cores_per_node[j])
        base = throughput_at(theta, cores, log_share=model.log_share)
        asked = min(coda._user_cores(j, gpn), coda.nodes.max_cores)
        work = float(coda.t.duration_s[j]) * throughput_at(theta, asked, log_share=model.log_share)
        cause = _slow_cause(coda, j, theta, k, base)
        slow_by[cause] += gpn * k * coda.slow_s.get(j, 0.0)
        # Running-time gap to the oracle's run: cores, probes, contention (the rest).
        o_cores = int(oracle.cores_per_node[j])
        o_run = work / max(throughput_at(theta, o_cores, log_share=model.log_share), 1e-9)
        by_cores = work / max(base, 1e-9) - o_run
        by_probe = 0.0
        if j in coda.probed:
            pr = coda.probe_memo[(int(wl.workload[j]), cores, gpn)]
            by_probe = pr.lost_work_s / max(base, 1e-9)
        core_cause = cause if base < _SLOW else "cores >= 90 %"
        gap_run[f"cores: {core_cause}"] += by_cores
        gap_run["probing"] += by_probe
        gap_run["contention and rest"] += run_s - o_run - by_cores - by_probe
    return slow_by, gap_run, total_gpu_s


def _report_jct(sims: dict[str, _Recorder], done: list[int], gap_run: dict[str, float]) -> None:
    """Mean JCT of the three runs, waiting and running, the running gap by cause."""
    coda, oracle, perfect = sims["coda"], sims["oracle"], sims["perfect"]
    n = len(done)
    idx = np.asarray(done)
    sub = coda.t.submit_s[idx]
    c_wait = float(np.mean(coda.start_s[idx] - sub))
    o_wait = float(np.mean(oracle.start_s[idx] - sub))
    c_run = float(np.mean(coda.end_s[idx] - coda.start_s[idx]))
    o_run = float(np.mean(oracle.end_s[idx] - oracle.start_s[idx]))
    p_jct = float(np.mean(perfect.end_s[idx] - sub))
    print(
        f"\nmean JCT: coda {(c_wait + c_run) / 3600:.2f} h, "
        f"oracle {(o_wait + o_run) / 3600:.2f} h, "
        f"coda with perfect profiles {p_jct / 3600:.2f} h"
    )
    print(f"  waiting  coda {c_wait / 3600:6.2f} h  oracle {o_wait / 3600:6.2f} h")
    print(f"  running  coda {c_run / 3600:6.2f} h  oracle {o_run / 3600:6.2f} h")
    print("  running gap by cause (mean hours per job):")
    for cause, s in sorted(gap_run.items(), key=lambda kv: -kv[1]):
        print(f"    {cause:<26} {s / n / 3600:7.3f}")
    p_wait = float(np.mean(perfect.start_s[idx] - sub))
    print(
        f"  perfect profiles: waiting {p_wait / 3600:6.2f} h, "
        f"running {(p_jct - p_wait) / 3600:6.2f} h"
    )


def _report_over(coda: _Recorder, done: list[int]) -> None:
    """Core-hours held above the sweet spot (they can keep other jobs waiting), by profile
    state, and the profile states seen at submission."""
    over: dict[str, float] = defaultdict(float)
    total_core_h = 0.0
    for j in done:
        gpn, k = coda._gpn_nodes(j)
        want = coda._best_cores(j, gpn, k)
        held_h = float(coda.end_s[j] - coda.start_s[j]) / 3600
        extra = max(0, int(coda.cores_per_node[j]) - want) * k
        state = "multi-node" if k > 1 else coda.seen.get(j, ("none", None))[0]
        over[state] += extra * held_h
        total_core_h += int(coda.cores_per_node[j]) * k * held_h
    print(f"\ncore-hours held above the sweet spot (of {total_core_h:,.0f} held by GPU jobs):")
    for state, h in sorted(over.items(), key=lambda kv: -kv[1]):
        print(f"  {state:<12} {h:12,.0f}")
    states: dict[str, int] = defaultdict(int)
    for j in done:
        states[coda.seen.get(j, ("none", None))[0]] += 1
    print(
        "\nprofile seen at submission: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--cpu-load", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--coda-conf", action="append", default=[])
    a = ap.parse_args()

    trace, nodes, wl, model = _setup(a.trace, a.jobs, a.load, a.cpu_load, a.seed)
    params = SimParams(coda_conf=tuple(CODA_CONF) + tuple(a.coda_conf))
    sims = run_all(trace, nodes, wl, model, params)
    coda, oracle = sims["coda"], sims["oracle"]
    gpu = np.flatnonzero(trace.gpus > 0)
    done = [j for j in gpu if not math.isnan(coda.end_s[j]) and not math.isnan(oracle.end_s[j])]
    print(
        f"{trace.name}: {len(gpu):,} GPU jobs, {len(done):,} finished under both; "
        f"{len(nodes)} nodes; probed {coda.counters['probed_jobs']:,}, "
        f"published {coda.counters['profiles_published']:,}"
        f" ({coda.counters['profiles_published_ended']:,} of them by jobs that ended first)"
    )
    _report_ratios(coda, wl, done)
    slow_by, gap_run, total_gpu_s = _slow_and_gap(sims, wl, model, done)
    print(f"\nGPU-job run time below {_SLOW:.0%} of plateau (share of all GPU-job GPU-hours)")
    for cause, s in sorted(slow_by.items(), key=lambda kv: -kv[1]):
        print(f"  {cause:<14} {_pct(s / total_gpu_s)}")
    print(f"  {'total':<14} {_pct(sum(slow_by.values()) / total_gpu_s)}")
    _report_jct(sims, done, gap_run)
    _report_over(coda, done)


if __name__ == "__main__":
    main()
