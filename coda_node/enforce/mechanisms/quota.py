"""``quota``: cap a job's CPU time with a CFS bandwidth quota (v1: in coda's own
``coda/job_<id>`` cpu cgroup, which the job's threads are moved into), and lift it."""

from __future__ import annotations

import logging
import math
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
    cores,
    flag,
    sampled,
)
from coda_node.policy.targets import JobTarget
from coda_node.system.capability import Capability
from coda_node.system.cgroups import CgroupError, CgroupJob, CpuQuotaWriter, Detail
from coda_node.system.check import probe_cpu_quota
from coda_node.system.paths import SystemRoot

log = logging.getLogger("coda-node")


@dataclass(slots=True)
class QuotaRecord(Record):
    quota_original: float | None = None
    """The job's CPU quota in cores before coda-node set one (None = unlimited)."""
    quota_applied: float | None = None
    quota_active: bool = False

    def is_empty(self) -> bool:
        return not self.quota_active

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QuotaRecord:
        return cls(
            quota_original=cores(d.get("quota_original"), "quota_original"),
            quota_applied=cores(d.get("quota_applied"), "quota_applied"),
            quota_active=flag(d.get("quota_active", False), "quota_active"),
        )


class Quota(Mechanism):
    name = "quota"
    record = QuotaRecord
    events = (("cpu quota released", "quota-release"), ("cpu quota ", "quota"))
    through_cgroups = True
    limit_options = (
        click.Option(
            ["--cpu-quota", "quota_cores"],
            type=click.FloatRange(min=0, min_open=True),
            help="Cap the job's CPU time at this many cores' worth.",
        ),
    )
    writer: CpuQuotaWriter | None

    @classmethod
    def probe(cls, root: SystemRoot) -> list[Capability]:
        """The cgroup cpu controller."""
        return [probe_cpu_quota(root)]

    @classmethod
    def limit_fields(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        quota = given.get("quota_cores")
        if quota is not None and not math.isfinite(quota):
            raise CliError(f"--cpu-quota {quota}: not a number of cores")
        return dict(given)

    def apply(
        self, step: JobStep, cg: CgroupJob, target: JobTarget, rec: QuotaRecord, r: JobResult
    ) -> None:
        if self.writer is None:
            return
        if target.quota_cores is not None:
            if not rec.quota_active:
                rec.quota_original = self.writer.original_quota(cg)
                rec.quota_active = True
                step.write_ahead()
            changed = rec.quota_applied != target.quota_cores
            seen = sampled(cg, target.quota_cores, with_tasks=True)
            if not step.is_settled(seen):
                # Checked every tick the job's tasks change: moves tasks that started (v1).
                written = self.writer.set_quota(cg, target.quota_cores)
                step.checked(seen, written)
            if changed:
                r.applied.append(f"cpu quota {target.quota_cores:g} cores")
            rec.quota_applied = target.quota_cores
        elif rec.quota_active:
            step.unsettle()
            self.writer.put_back(cg, rec.quota_original)
            r.applied.append("cpu quota released")
            rec.quota_active = False
            rec.quota_applied = None
            rec.quota_original = None
            step.save()

    def repair(
        self, step: JobStep, cg: CgroupJob, allocation: frozenset[int], r: JobResult
    ) -> None:
        if self.writer is not None and self.writer.set_quota(cg, None):
            r.applied.append("cpu quota released")

    def ended(self, job_id: int, rec: QuotaRecord) -> None:
        if rec.quota_active and self.writer is not None:
            self.writer.release(job_id)

    def tidy(
        self,
        records: Mapping[int, QuotaRecord],
        jobs: Mapping[int, CgroupJob],
        results: dict[int, JobResult],
    ) -> None:
        """Remove the v1 ``coda/job_<id>`` cpu cgroups no record covers: those of jobs that
        ended, and any a lost record left on a running job (its threads go back to the cpu
        hierarchy's root and its quota with the directory)."""
        if self.writer is None:
            return
        used = {j for j, rec in records.items() if rec.quota_active}
        for job_id in self.writer.coda_dirs():
            if job_id in used:
                continue
            try:
                moved = self.writer.release(job_id)
            except CgroupError as exc:
                log.error("job=%d cannot remove coda's cpu cgroup: %s", job_id, exc)
                continue
            if job_id in jobs:
                r = results.setdefault(job_id, JobResult())
                r.applied.append("cpu quota released" + (" (no record of it)" if moved else ""))

    @classmethod
    def detail(cls, rec: QuotaRecord) -> Detail:
        return "tasks" if rec.quota_active else "cpus"
