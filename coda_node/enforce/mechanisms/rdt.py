"""``rdt``: Intel RDT through resctrl: a job's memory bandwidth (MBA) and L3 cache ways
(CAT) limited by moving its threads into one of coda's control groups, one per class of
limits, and out again."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from coda_node.enforce.mechanisms.base import (
    JobResult,
    JobStep,
    Mechanism,
    Record,
    text,
)
from coda_node.policy.targets import JobTarget
from coda_node.system.capability import Capability
from coda_node.system.cgroups import CgroupJob, Detail
from coda_node.system.check import probe_resctrl
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import OutOfIds, ResctrlControl, ResctrlError, l3_mask, mb_value

log = logging.getLogger("coda-node")

_RDT_CLASS = re.compile(r"coda_(?:mb(\d+)(?:_l3w(\d+))?|l3w(\d+))")


@dataclass(frozen=True, slots=True)
class RdtClass:
    """What a coda resctrl control group limits: the MB value written to ``MB:`` and the
    number of L3 ways of its ``L3:`` mask; None where the group keeps the default (100 %,
    the full mask)."""

    mb: int | None = None
    l3_ways: int | None = None

    @property
    def group(self) -> str:
        """``coda_mb<v>``, ``coda_l3w<n>`` or ``coda_mb<v>_l3w<n>``: jobs limited alike
        share one group (one CLOSID)."""
        parts = ([f"mb{self.mb}"] if self.mb is not None else []) + (
            [f"l3w{self.l3_ways}"] if self.l3_ways is not None else []
        )
        return "coda_" + "_".join(parts)

    @staticmethod
    def of(group: str) -> RdtClass | None:
        """The class a group name stands for; None for a name that is not one."""
        m = _RDT_CLASS.fullmatch(group)
        if m is None:
            return None
        mb, l3_with_mb, l3_alone = m.groups()
        ways = l3_with_mb or l3_alone
        return RdtClass(
            mb=int(mb) if mb is not None else None,
            l3_ways=int(ways) if ways is not None else None,
        )

    def at_least_as_strict(self, other: RdtClass) -> bool:
        """Whether a job limited to ``other`` may be put here: every resource ``other``
        limits is limited here too, to no more (lower MB, fewer ways)."""
        return (other.mb is None or (self.mb is not None and self.mb <= other.mb)) and (
            other.l3_ways is None or (self.l3_ways is not None and self.l3_ways <= other.l3_ways)
        )

    def describe(self, l3_total: int | None) -> list[str]:
        """The enforcer's lines for this class, one per limited resource."""
        out = []
        if self.mb is not None:
            out.append(f"memory bandwidth {self.mb}")
        if self.l3_ways is not None:
            out.append(f"L3 cache {self.l3_ways} of {l3_total or '?'} ways")
        return out


@dataclass(slots=True)
class RdtRecord(Record):
    rdt_group: str | None = None
    """The resctrl control group coda-node moved the job's tasks into."""
    rdt_mon_group: str | None = None

    def is_empty(self) -> bool:
        return self.rdt_group is None and self.rdt_mon_group is None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RdtRecord:
        return cls(
            rdt_group=text(d.get("rdt_group"), "rdt_group"),
            rdt_mon_group=text(d.get("rdt_mon_group"), "rdt_mon_group"),
        )


class Rdt(Mechanism):
    name = "rdt"
    record = RdtRecord
    events = (
        ("memory bandwidth released", "mem-bw-release"),
        ("memory bandwidth ", "mem-bw"),
        ("L3 cache ways released", "l3-release"),
        ("L3 cache ", "l3"),
    )
    limit_options = (
        click.Option(
            ["--mem-bw", "mem_bw_pct"],
            type=click.IntRange(min=1),
            help="Cap the job's memory bandwidth (Intel RDT MBA: percent, or MBps on mba_MBps).",
        ),
    )
    writer: ResctrlControl | None

    @classmethod
    def probe(cls, root: SystemRoot) -> list[Capability]:
        """resctrl's MBA, CAT and MBM (the monitoring the same mount offers)."""
        return probe_resctrl(root)

    @classmethod
    def limit_fields(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        return dict(given)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return self.writer.locked() if self.writer is not None else contextlib.nullcontext()

    def _class(self, target: JobTarget) -> RdtClass:
        """The control group class of a target: its MB value as the kernel takes it, and
        its L3 ways (a limit of the whole cache or more is no limit)."""
        assert self.writer is not None
        info = self.writer.info
        mb: int | None = None
        if target.mem_bw_pct is not None:
            if info.mb is None:
                raise ResctrlError(f"no MB resource: {info.mb_reason}")
            mb = mb_value(target.mem_bw_pct, info.mb)
        ways: int | None = None
        if target.l3_ways is not None:
            if info.l3 is None:
                raise ResctrlError(f"no L3 cache allocation: {info.l3_reason}")
            if target.l3_ways < info.l3.cbm_bits:
                ways = max(target.l3_ways, info.l3.min_cbm_bits)
        return RdtClass(mb=mb, l3_ways=ways)

    def apply(
        self, step: JobStep, cg: CgroupJob, target: JobTarget, rec: RdtRecord, r: JobResult
    ) -> None:
        """One shared control group per class of limits (``coda_mb<v>``, ``coda_l3w<n>``,
        ``coda_mb<v>_l3w<n>``): CLOSIDs are few (often 8-16 per socket), so jobs limited
        alike share one. Each group's schemata limits only what its name says; the other
        resource keeps the new group's default (100 %, the full mask)."""
        if self.writer is None:
            return
        want = self._class(target)
        l3_total = self.writer.info.l3.cbm_bits if self.writer.info.l3 else None
        had = RdtClass.of(rec.rdt_group) if rec.rdt_group is not None else None
        if want == RdtClass():
            if rec.rdt_group is not None:
                self._release(step, cg, rec)
                r.applied += _released_lines(had, want) or ["memory bandwidth released"]
                step.save()
            return
        name = want.group
        try:
            self.writer.ensure_group(name)
        except OutOfIds as exc:
            shared = self._stricter_group(want, keep=rec.rdt_group)
            if shared is None and self._give_back_own_group(step, cg, rec, r):
                # The job's own (looser) group held a CLOSID only it used: try once more.
                had = None
                with contextlib.suppress(OutOfIds):
                    self.writer.ensure_group(name)
                    shared = name
            if shared is None:
                raise ResctrlError(
                    f"no free CLOSID for a {' and '.join(want.describe(l3_total))} group "
                    f"and no stricter coda group to share ({exc})"
                ) from exc
            if shared != name and shared != rec.rdt_group:
                log.warning("job=%d no free CLOSID; sharing %s instead", cg.job_id, shared)
            name = shared
        if rec.rdt_group != name:
            if rec.rdt_group is not None:
                self._release(step, cg, rec)
            rec.rdt_group = name
            step.write_ahead()  # the group is on record before tasks move
            now = RdtClass.of(name) or RdtClass()
            before = had.describe(l3_total) if had else []
            r.applied += [line for line in now.describe(l3_total) if line not in before]
            r.applied += _released_lines(had, now)
        if name == want.group:
            self._set_class_schemata(want)
        # Every tick: threads started since the last one join the group.
        self.writer.assign_tasks(name, step.tids(cg))

    def _give_back_own_group(
        self, step: JobStep, cg: CgroupJob, rec: RdtRecord, r: JobResult
    ) -> bool:
        """Take the job out of its group and remove the group when no other job uses it
        (its CLOSID is then free for the job's new class). False when there is nothing to
        give back."""
        assert self.writer is not None
        old = rec.rdt_group
        if old is None or any(
            other.rdt_group == old for _, other in step.records(self.name) if other is not rec
        ):
            return False
        self._release(step, cg, rec)
        r.applied += _released_lines(RdtClass.of(old), RdtClass()) or ["memory bandwidth released"]
        step.save()
        self.writer.remove_group(old)
        return True

    def _set_class_schemata(self, cls: RdtClass) -> None:
        """Write the limits of ``cls`` into its group, in every domain. The L3 mask is the
        *low* ways: Intel DDIO writes inbound PCIe traffic (a GPU job's input DMA) into a
        few ways at the top of the LLC by default (Intel Data Direct I/O Technology
        overview), so a CPU job kept to the low ways stays away from those lines."""
        assert self.writer is not None
        info = self.writer.info
        mb = None
        if cls.mb is not None and info.mb is not None:
            mb = dict.fromkeys(info.mb.domain_ids, cls.mb)
        l3 = None
        if cls.l3_ways is not None and info.l3 is not None:
            l3 = dict.fromkeys(info.l3.domain_ids, l3_mask(cls.l3_ways, info.l3, from_high=False))
        self.writer.set_schemata(cls.group, mb=mb, l3=l3)

    def _release(self, step: JobStep, cg: CgroupJob, rec: RdtRecord) -> None:
        assert self.writer is not None and rec.rdt_group is not None
        self.writer.release_tasks(rec.rdt_group, step.tids(cg))
        rec.rdt_group = None

    def _stricter_group(self, want: RdtClass, keep: str | None = None) -> str | None:
        """An existing coda group at least as strict as ``want`` on every resource it
        limits (never looser), for when CLOSIDs run out. ``keep`` (the job's group now)
        when it qualifies, so a job does not hop between groups; else the closest: one
        that limits nothing else, then the smallest gap in MB, then in ways."""
        assert self.writer is not None
        best: tuple[tuple[int, int, int], str] | None = None
        for name in self.writer.list_coda_groups():
            cls = RdtClass.of(name)
            if cls is None or not cls.at_least_as_strict(want):
                continue
            if name == keep:
                return name
            extra = (want.mb is None and cls.mb is not None) + (
                want.l3_ways is None and cls.l3_ways is not None
            )
            gap_mb = want.mb - cls.mb if want.mb is not None and cls.mb is not None else 0
            gap_ways = (
                want.l3_ways - cls.l3_ways
                if want.l3_ways is not None and cls.l3_ways is not None
                else 0
            )
            key = (extra, gap_mb, gap_ways)
            if best is None or key < best[0]:
                best = (key, name)
        return best[1] if best else None

    def repair(
        self, step: JobStep, cg: CgroupJob, allocation: frozenset[int], r: JobResult
    ) -> None:
        if self.writer is None:
            return
        tids = step.tids(cg)
        for group in self.writer.list_coda_groups():
            if self.writer.release_tasks(group, tids).moved:
                r.applied.append(f"resctrl group {group} left")

    def ended(self, job_id: int, rec: RdtRecord) -> None:
        rec.rdt_group = None  # its threads are gone; the group goes if no one else uses it

    def tidy(
        self,
        records: Mapping[int, RdtRecord],
        jobs: Mapping[int, CgroupJob],
        results: dict[int, JobResult],
    ) -> None:
        """Remove coda's resctrl groups no recorded job uses: classes emptied this tick,
        and groups left by a daemon that crashed before recording them."""
        if self.writer is None:
            return
        used = {rec.rdt_group for rec in records.values() if rec.rdt_group}
        for name in self.writer.list_coda_groups():
            if name not in used:
                try:
                    self.writer.remove_group(name)
                except ResctrlError as exc:
                    log.error("cannot remove resctrl group %s: %s", name, exc)

    @classmethod
    def detail(cls, rec: RdtRecord) -> Detail:
        return "tasks" if rec.rdt_group is not None or rec.rdt_mon_group is not None else "cpus"


def _released_lines(had: RdtClass | None, now: RdtClass) -> list[str]:
    """The enforcer's lines for the resources ``had`` limited and ``now`` does not."""
    if had is None:
        return []
    out = []
    if had.mb is not None and now.mb is None:
        out.append("memory bandwidth released")
    if had.l3_ways is not None and now.l3_ways is None:
        out.append("L3 cache ways released")
    return out
