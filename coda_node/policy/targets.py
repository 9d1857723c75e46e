"""Node policy: a snapshot of the jobs in, the wanted state of each job out. Pure.

No ``os``, no files, no NVML here: the daemon hands in what sampling read, and
:mod:`coda_node.enforce.enforcer` makes the cgroups match what this returns. The targets come
from operators' limits (:class:`Limit`, ``coda-node limit``, stored by
:mod:`coda_node.enforce.state`); the adaptive allocator and the contention eliminator add theirs
through the same :class:`JobTarget`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coda_common.slurm.ranges import MAX_ID
from coda_node.system.cpulist import format_cpulist

Extra = tuple[tuple[str, Any], ...]
"""(mechanism name, its limit) pairs, sorted by name: a limit of a mechanism that
:class:`Limit` and :class:`JobTarget` have no field for
(:mod:`coda_node.enforce.mechanisms`)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """An operator's limit on one job (``coda-node limit``); None = leave as Slurm set."""

    cores: int | None = None
    """Keep the job on this many of its allocated cores (cpuset)."""
    cpus: tuple[int, ...] | None = None
    """Keep the job on exactly these of its allocated CPUs (cpuset)."""
    quota_cores: float | None = None
    """Cap the job's CPU time at this many cores' worth (CFS bandwidth)."""
    mem_bw_pct: int | None = None
    """Cap the job's memory bandwidth (Intel RDT MBA, percent of a socket's, or MBps on
    an mba_MBps mount)."""
    reason: str = ""
    extra: Extra = ()
    """Limits of mechanisms this module does not name: (mechanism, value) pairs, passed to
    the job's target as they are (:attr:`JobTarget.extra`)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cores": self.cores,
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "quota_cores": self.quota_cores,
            "mem_bw_pct": self.mem_bw_pct,
            "reason": self.reason,
        }
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: object) -> Limit:
        """The limit of one job as the limits file holds it; ValueError, saying which
        value, for a value of another type than ``coda-node limit`` writes (a hand edit, a
        damaged disk). Whether a value of the right type can be honoured :func:`plan`
        says."""
        if not isinstance(d, Mapping):
            raise ValueError(f"the limit is {_kind(d)}, not an object")
        cpus = d.get("cpus")
        if cpus is not None and (
            not isinstance(cpus, list) or not all(_whole(c, 0, MAX_ID) for c in cpus)
        ):
            raise ValueError(f"cpus is {_shown(cpus)}, not a list of CPU numbers")
        extra = d.get("extra", {})
        if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
            raise ValueError(f"extra is {_shown(extra)}, not limits by mechanism name")
        reason = d.get("reason", "")
        if not isinstance(reason, str):
            raise ValueError(f"reason is {_shown(reason)}, not text")
        return cls(
            cores=_opt_int(d, "cores"),
            cpus=tuple(cpus) if cpus is not None else None,
            quota_cores=_opt_cores(d, "quota_cores"),
            mem_bw_pct=_opt_int(d, "mem_bw_pct"),
            reason=reason,
            extra=tuple(sorted(extra.items())),
        )


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    """A whole number or None (what it may be, :func:`plan` says of the limit)."""
    value = d.get(key)
    if value is not None and not _whole(value, -(1 << 31), 1 << 31):
        raise ValueError(f"{key} is {_shown(value)}, not a whole number")
    return value


def _opt_cores(d: Mapping[str, Any], key: str) -> float | None:
    """A finite number of cores or None (what it may be, :func:`plan` says)."""
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{key} is {_shown(value)}, not a number of cores")
    return value


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the policy needs to know about one job."""

    job_id: int
    allocated_cpus: frozenset[int]
    """The CPUs Slurm gave the job on this node (before any change of ours)."""
    is_dnn: bool
    near_cpus: frozenset[int] = frozenset()
    """The CPUs local to the job's GPUs (sysfs ``local_cpulist``); empty when unknown. A
    job slimmed to fewer cores keeps these first."""


@dataclass(frozen=True, slots=True)
class JobTarget:
    """How a job should be; None fields mean "as Slurm set it"."""

    cpus: frozenset[int] | None = None
    quota_cores: float | None = None
    mem_bw_pct: int | None = None
    """Memory-bandwidth cap through RDT MBA (the value written to ``MB:``)."""
    reason: str = ""
    l3_ways: int | None = None
    """L3 ways the job may allocate in, through RDT CAT (the low ways of ``L3:``)."""
    extra: Extra = ()
    """Targets of mechanisms this class has no field for, by mechanism name."""

    @property
    def is_default(self) -> bool:
        return (
            self.cpus is None
            and self.quota_cores is None
            and self.mem_bw_pct is None
            and self.l3_ways is None
            and not self.extra
        )

    def extra_for(self, name: str) -> Any:
        """The target of mechanism ``name`` in :attr:`extra`; None for none."""
        return dict(self.extra).get(name)


@dataclass(frozen=True, slots=True)
class PlanProblem:
    job_id: int
    message: str


def choose_cpus(
    allocated: frozenset[int], cores: int, near: frozenset[int] = frozenset()
) -> frozenset[int]:
    """``cores`` CPUs of the allocation: first those in ``near`` (the CPUs local to the
    job's GPUs, :mod:`coda_node.system.topology`), then the rest; lowest-numbered first within
    each, so that repeated plans pick the same CPUs and a tick never moves a job back and
    forth."""
    return frozenset(sorted(allocated, key=lambda cpu: (cpu not in near, cpu))[:cores])


def quota_that_caps(quota_cores: float | None, cpu_count: int) -> float | None:
    """``quota_cores``, or None where it is at or above ``cpu_count``: a CPU quota of the
    job's CPUs or more changes nothing, so it is no quota."""
    if quota_cores is not None and quota_cores >= cpu_count:
        return None
    return quota_cores


def plan(
    jobs: Mapping[int, JobFacts],
    limits: Mapping[int, Limit],
    *,
    mba: str | None = None,
) -> tuple[dict[int, JobTarget], list[PlanProblem]]:
    """Targets for every job that should differ from Slurm's setting, and the limits
    that cannot be honoured (with why). Jobs not in the result are to be as Slurm set
    them; limits for jobs not on this node are ignored (the job may not have started).
    ``mba`` is None when memory-bandwidth allocation works here, else why it does not."""
    targets: dict[int, JobTarget] = {}
    problems: list[PlanProblem] = []
    for job_id, limit in sorted(limits.items()):
        if (facts := jobs.get(job_id)) is None:
            continue
        allocated = facts.allocated_cpus
        cpus: frozenset[int] | None = None
        if limit.cpus is not None:
            wanted = frozenset(limit.cpus)
            outside = wanted - allocated
            if not wanted:
                problems.append(PlanProblem(job_id, "an empty CPU list is not a limit"))
            elif outside:
                problems.append(
                    PlanProblem(
                        job_id,
                        f"CPUs {format_cpulist(outside)} are outside the job's allocation "
                        f"{format_cpulist(allocated)}; the cpuset limit is not applied",
                    )
                )
            elif wanted != allocated:
                cpus = wanted
        elif limit.cores is not None:
            if limit.cores < 1:
                problems.append(PlanProblem(job_id, "a job keeps at least 1 core"))
            elif limit.cores < len(allocated):
                cpus = choose_cpus(allocated, limit.cores, facts.near_cpus)
        quota = limit.quota_cores
        if quota is not None and quota <= 0:
            problems.append(PlanProblem(job_id, "a CPU quota must be more than 0 cores"))
            quota = None
        quota = quota_that_caps(quota, len(cpus if cpus is not None else allocated))
        mem_bw = limit.mem_bw_pct
        if mem_bw is not None and mba is not None:
            problems.append(PlanProblem(job_id, f"memory-bandwidth limit not applied: {mba}"))
            mem_bw = None
        elif mem_bw is not None and mem_bw <= 0:
            problems.append(PlanProblem(job_id, "a memory-bandwidth limit must be more than 0"))
            mem_bw = None
        target = JobTarget(
            cpus=cpus,
            quota_cores=quota,
            mem_bw_pct=mem_bw,
            reason=limit.reason or "admin limit",
            extra=limit.extra,
        )
        if not target.is_default:
            targets[job_id] = target
    return targets, problems
