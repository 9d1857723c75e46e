"""What every enforcement mechanism is to the enforcer: a :class:`Mechanism` that applies
its part of a job's target, puts it back, repairs it and cleans up after a job that ended,
and a :class:`Record` of what it changed on one job (its part of the state file).

A mechanism never writes the state file itself: it fills in its record and asks the
:class:`JobStep` it is handed to put the record on disk (:meth:`JobStep.write_ahead`,
fsynced, before the change it covers) or to save it once a change is undone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import click

from coda_common.slurm.ranges import MAX_ID
from coda_node.policy.targets import JobTarget
from coda_node.system.capability import Capability
from coda_node.system.cgroups import CgroupError, CgroupJob, CgroupLayout, Detail
from coda_node.system.cpulist import parse_cpulist
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import ResctrlError

ENFORCE_ERRORS: tuple[type[Exception], ...] = (CgroupError, ResctrlError)
"""The errors a mechanism's writes raise for a refused or failed write: reported on the
job as ``<mechanism>: <error>``; anything else is reported as unexpected."""


@dataclass(slots=True)
class JobResult:
    applied: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    gone: bool = False


R = TypeVar("R", bound="Record")


@dataclass(slots=True)
class Record:
    """One mechanism's part of a job's record in the state file: its fields are keys of
    the job's flat JSON object, so each field name must be unique among all mechanisms.
    Subclasses are dataclasses whose fields default to "nothing changed"."""

    def is_empty(self) -> bool:
        """Whether the record covers nothing (everything it changed is back)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """The record from a job's flat object (keys of other mechanisms are ignored);
        raises ValueError for a value that does not parse."""
        raise NotImplementedError

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


class JobStep(Protocol):
    """What a mechanism's call sees of the enforcer for one job: the record's write-ahead
    and save, and the check-skipping of this mechanism on this job."""

    job_id: int

    def write_ahead(self) -> None:
        """Put the job's record on disk, fsynced, before the change it now covers."""

    def save(self) -> None:
        """Save the job's record after a change was undone."""

    def is_settled(self, seen: object) -> bool:
        """Whether this tick's full check may be skipped (:func:`sampled` unchanged)."""

    def checked(self, seen: object, written: int) -> None:
        """Record a full check that wrote ``written`` values."""

    def unsettle(self) -> None:
        """Check in full from the next tick on."""

    def tids(self, cg: CgroupJob) -> list[int]:
        """The thread ids of the job's tasks."""

    def records(self, name: str) -> Iterable[tuple[int, Record]]:
        """(job, record) of mechanism ``name`` for every job on record."""


class Mechanism:
    """One way of limiting a job. Subclasses set :attr:`name`, :attr:`record` and
    :attr:`events`, and implement :meth:`apply`; the other hooks default to nothing.

    ``writer`` is what the mechanism writes through (None: the node offers no such
    control, and every call does nothing)."""

    name: ClassVar[str]
    """The name in coda.conf's NodeEnforce, in the state file's logs and in status."""
    record: ClassVar[type[Record]]
    events: ClassVar[tuple[tuple[str, str], ...]] = ()
    """(prefix of an "applied" line, status event action), the most specific first. An
    action ending ``-release`` or ``-restore`` undoes a limit; the others set one."""
    through_cgroups: ClassVar[bool] = False
    """Whether it limits a job through the job's Slurm cgroups: ``coda-node check`` shows
    its :meth:`probe` rows before the Slurm job cgroups row, the others' after it."""
    throttles: ClassVar[bool] = True
    """Whether the limits it sets hold a job back the way a throttle does: ``coda-node
    status`` paints their events as it paints a throttle's."""
    limit_options: ClassVar[tuple[click.Option, ...]] = ()
    """``coda-node limit``'s options that ask for this mechanism's limit (their flags and
    parameter names unique among all mechanisms'); :meth:`limit_fields` turns their values
    into the limit."""

    def __init__(self, writer: Any | None) -> None:
        self.writer = writer

    @classmethod
    def open(cls, root: SystemRoot, layout: CgroupLayout) -> Any | None:
        """The writer the daemon hands this mechanism on a node whose Slurm cgroup tree
        is ``layout``; None where the node offers none. The built-in mechanisms' writers
        are built by the daemon itself (coda_node.daemon.wiring), which tests replace."""
        return None

    @classmethod
    def probe(cls, root: SystemRoot) -> list[Capability]:
        """``coda-node check``'s rows (and the status screen's capabilities) for what this
        mechanism needs on the node at ``root``."""
        return []

    @classmethod
    def limit_fields(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """The :class:`~coda_node.policy.targets.Limit` fields that ``given`` asks for: the
        values of this mechanism's :attr:`limit_options` that were given, by parameter name
        (empty: nothing of this mechanism). Raises :class:`~coda_common.cli.CliError` for
        values that are no limit.

        By default the limit is kept in ``Limit.extra`` under the mechanism's name: the
        value of its one option, or with several options the mapping ``given``."""
        if not given:
            return {}
        value = next(iter(given.values())) if len(cls.limit_options) == 1 else dict(given)
        return {"extra": ((cls.name, value),)}

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Held around a tick's, a restore's or a repair's writes of every job."""
        return contextlib.nullcontext()

    def apply(
        self, step: JobStep, cg: CgroupJob, target: JobTarget, rec: Any, r: JobResult
    ) -> None:
        """Bring the job to its part of ``target``, or put back what ``rec`` says was
        changed where ``target`` asks for nothing of this mechanism."""
        raise NotImplementedError

    def repair(
        self, step: JobStep, cg: CgroupJob, allocation: frozenset[int], r: JobResult
    ) -> None:
        """Put the job back as Slurm sets a job on ``allocation``, with no record to go by."""

    def ended(self, job_id: int, rec: Any) -> None:
        """The job is gone: remove what of it is the mechanism's own. Raises an
        :data:`ENFORCE_ERRORS` error to keep the record for a retry."""

    def tidy(
        self,
        records: Mapping[int, Any],
        jobs: Mapping[int, CgroupJob],
        results: dict[int, JobResult],
    ) -> None:
        """After every job: remove what of the mechanism's own no record in ``records``
        (job -> this mechanism's record) uses. Called with :meth:`locked` held."""

    @classmethod
    def detail(cls, rec: Any) -> Detail:
        """How much of the job's cgroup tree (:data:`~coda_node.system.cgroups.Detail`)
        the sample must read to undo ``rec``."""
        return "cpus"


def sampled(cg: CgroupJob, target: object, *, with_tasks: bool) -> object:
    """What a skipped check relies on: the target and the job as this tick's sample shows
    it (its CPUs, each step's CPUs, with ``with_tasks`` its tasks). None when the job was
    listed without its steps (or, ``with_tasks``, without its tasks): then nothing may be
    skipped."""
    if cg.detail == "cpus" or (with_tasks and cg.detail != "tasks"):
        return None
    steps = tuple((s.name, s.cpus) for s in cg.steps)
    return (target, cg.cpus, steps, cg.pids if with_tasks else None)


# -- checks of a record's values as read from the state file ---------------------------


def kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def cpu_list_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {kind(value)}, not a CPU list")
    parse_cpulist(value)  # raises ValueError with the list, and for a CPU above MAX_ID
    return value


def cpu_ids(value: object, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_ID for c in value
    ):
        raise ValueError(f"{what} is not a list of CPU numbers")
    return list(value)


def cores(value: object, what: str) -> float | None:
    if value is None:
        return None
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{what} is {value!r}, not a positive number of cores")
    return float(value)


def text(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} is {kind(value)}, not a name")
    return value


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} is {kind(value)}, not true or false")
    return value
