"""``cpuset``: keep a job on fewer of its allocated CPUs by shrinking its cgroup cpusets
(the job's, each step's, each task's affinity), and put them back as Slurm set them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from coda_common.cli import CliError
from coda_node.enforce.mechanisms.base import (
    JobResult,
    JobStep,
    Mechanism,
    Record,
    cpu_ids,
    cpu_list_text,
    kind,
    sampled,
)
from coda_node.policy.targets import JobTarget
from coda_node.system.capability import Capability
from coda_node.system.cgroups import (
    CgroupJob,
    CpusetSnapshot,
    CpusetWriter,
    Detail,
    format_cpulist,
    parse_cpulist,
)
from coda_node.system.check import probe_cpuset_control
from coda_node.system.paths import SystemRoot


def snapshot_to_dict(snap: CpusetSnapshot) -> dict[str, Any]:
    return {
        "job_id": snap.job_id,
        "cpus": dict(snap.cpus),
        "affinity": {str(tid): format_cpulist(mask) for tid, mask in snap.affinity.items()},
    }


def snapshot_from_dict(d: Mapping[str, Any]) -> CpusetSnapshot:
    return CpusetSnapshot(
        job_id=int(d["job_id"]),
        cpus={str(k): str(v) for k, v in d["cpus"].items()},
        affinity={int(k): parse_cpulist(v) for k, v in d.get("affinity", {}).items()},
    )


@dataclass(slots=True)
class CpusetRecord(Record):
    cpuset_original: dict[str, Any] | None = None
    """The cpuset snapshot taken before the first shrink (:func:`snapshot_to_dict`)."""
    cpuset_applied: list[int] | None = None
    allocated_cpus: list[int] | None = None
    """The job's CPUs as Slurm allocated them (effective CPUs on v2, where a job's
    ``cpuset.cpus`` may be empty and inherited), recorded before the first change."""

    def is_empty(self) -> bool:
        return self.cpuset_original is None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CpusetRecord:
        original = d.get("cpuset_original")
        if original is not None:
            _check_snapshot(original)
        return cls(
            cpuset_original=original,
            cpuset_applied=cpu_ids(d.get("cpuset_applied"), "cpuset_applied"),
            allocated_cpus=cpu_ids(d.get("allocated_cpus"), "allocated_cpus"),
        )


def _check_snapshot(value: object) -> None:
    """A cpuset snapshot (:func:`snapshot_to_dict`) that can be put back."""
    if not isinstance(value, Mapping):
        raise ValueError(f"cpuset_original is {kind(value)}, not an object")
    job_id = value.get("job_id")
    if not isinstance(job_id, int) or isinstance(job_id, bool):
        raise ValueError(f"cpuset_original.job_id is {kind(job_id)}, not a job id")
    cpus = value.get("cpus")
    if not isinstance(cpus, Mapping) or "." not in cpus:
        raise ValueError("cpuset_original.cpus has no cpuset for the job itself")
    for rel, text in cpus.items():
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"cpuset_original.cpus names {rel!r}, not a directory of the job")
        cpu_list_text(text, f"cpuset_original.cpus[{rel!r}]")
    affinity = value.get("affinity", {})
    if not isinstance(affinity, Mapping):
        raise ValueError(f"cpuset_original.affinity is {kind(affinity)}, not an object")
    for tid, mask in affinity.items():
        if not (isinstance(tid, str) and tid.isdecimal()):
            raise ValueError(f"cpuset_original.affinity names {tid!r}, not a thread id")
        cpu_list_text(mask, f"cpuset_original.affinity[{tid}]")


class Cpuset(Mechanism):
    name = "cpuset"
    record = CpusetRecord
    events = (("cpuset restored", "cpuset-restore"), ("cpuset ", "cpuset"))
    throttles = False
    """A cpuset is where a job runs, which the adaptive allocator sets as the job's need
    changes: no throttle."""
    through_cgroups = True
    limit_options = (
        click.Option(
            ["--cores"], type=click.IntRange(min=1), help="Keep the job on N of its cores."
        ),
        click.Option(
            ["--cpus", "cpu_list"], help="Keep the job on these of its CPUs (e.g. 0-3,8)."
        ),
    )
    writer: CpusetWriter | None

    @classmethod
    def probe(cls, root: SystemRoot) -> list[Capability]:
        """The cgroup cpuset controller."""
        return [probe_cpuset_control(root)]

    @classmethod
    def limit_fields(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """``--cores`` N, or ``--cpus`` a CPU list (not both)."""
        cores: int | None = given.get("cores")
        cpu_list: str | None = given.get("cpu_list")
        if cores is not None and cpu_list is not None:
            raise CliError("give --cores or --cpus, not both")
        if cpu_list is None:
            return {} if cores is None else {"cores": cores}
        try:
            cpus = tuple(sorted(parse_cpulist(cpu_list)))
        except ValueError as exc:
            raise CliError(f"bad CPU list {cpu_list!r}", str(exc)) from None
        if not cpus:
            raise CliError("an empty CPU list is not a limit")
        return {"cpus": cpus}

    def apply(
        self, step: JobStep, cg: CgroupJob, target: JobTarget, rec: CpusetRecord, r: JobResult
    ) -> None:
        if self.writer is None:
            return
        if target.cpus is not None:
            self._record_original(step, cg, rec)
            seen = sampled(cg, target.cpus, with_tasks=False)
            if not step.is_settled(seen):
                snap = snapshot_from_dict(rec.cpuset_original or {})
                written = self.writer.shrink(cg, target.cpus, snapshot=snap)
                if written:
                    r.applied.append(f"cpuset {format_cpulist(target.cpus)}")
                step.checked(seen, written)
            rec.cpuset_applied = sorted(target.cpus)
        elif rec.cpuset_original is not None:
            step.unsettle()
            snap = snapshot_from_dict(rec.cpuset_original)
            self.writer.restore(cg, snap)
            r.applied.append(f"cpuset restored to {snap.cpus.get('.', '?')}")
            rec.cpuset_original = None
            rec.cpuset_applied = None
            rec.allocated_cpus = None
            step.save()

    def _record_original(self, step: JobStep, cg: CgroupJob, rec: CpusetRecord) -> None:
        """Slurm's setting of the job and of each of its steps on disk before a change."""
        assert self.writer is not None
        if rec.cpuset_original is None:
            rec.cpuset_original = snapshot_to_dict(self.writer.snapshot(cg))
            rec.allocated_cpus = sorted(cg.cpus)
            step.write_ahead()
        elif not {f"step_{s.name}" for s in cg.steps} <= set(rec.cpuset_original["cpus"]):
            # A step started since (slurmd gave it the full allocation): record how
            # Slurm set it, so that a restore puts it back too.
            fresh = snapshot_to_dict(self.writer.snapshot(cg))
            for rel, text in fresh["cpus"].items():
                rec.cpuset_original["cpus"].setdefault(rel, text)
            for tid, mask in fresh["affinity"].items():
                rec.cpuset_original["affinity"].setdefault(tid, mask)
            step.write_ahead()

    def repair(
        self, step: JobStep, cg: CgroupJob, allocation: frozenset[int], r: JobResult
    ) -> None:
        if self.writer is not None and self.writer.reset(cg, allocation):
            r.applied.append(
                f"cpuset restored to {format_cpulist(allocation)} (Slurm's allocation)"
            )

    @classmethod
    def detail(cls, rec: CpusetRecord) -> Detail:
        return "steps" if rec.cpuset_original is not None else "cpus"
