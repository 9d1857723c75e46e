"""The guard's pure part: per-test outcomes from a junit report, the tests that pass in a
baseline and fail with coda, the allowlist that may excuse them, and the summary the
version matrix prints.  No Slurm here (tests/test_schedmd_guard.py tests it as tables).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
MISSING = "missing"
"""A test the baseline ran that the other run never reported (its session died)."""
SUMMARY_FILE = "summary.json"
ALLOW_ALL = "*"


@dataclass(frozen=True, slots=True)
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.passed + other.passed, self.failed + other.failed, self.skipped + other.skipped
        )

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    def __str__(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


def node_id(case: ET.Element) -> str:
    """pytest's node id of a junit ``testcase`` written with ``junit_family=xunit1`` (which
    names the file): ``tests/commands/srun/test_--mem--mincpus--tmp.py::Test_mem::test_tmp``.
    The classes are what ``classname`` has beyond the file's dotted module path."""
    file = case.get("file", "")
    classname = case.get("classname", "")
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname[len(module) :].strip(".") if classname.startswith(module) else ""
    return "::".join(p for p in (file or classname, *classes.split("."), case.get("name")) if p)


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in a pytest junit report: failures and errors (setup or
    teardown too) are ``failed``, skips and expected failures ``skipped``."""
    root = ET.parse(junit).getroot()
    found: dict[str, str] = {}
    for case in root.iter("testcase"):
        tid = node_id(case)
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = FAILED
        elif "skipped" in tags:
            outcome = SKIPPED
        else:
            outcome = PASSED
        # pytest may report one test twice (a teardown error after a pass): the worse wins.
        if found.get(tid) != FAILED:
            found[tid] = outcome
    return found


def failure_messages(junit: Path) -> dict[str, str]:
    """Each failed test's message in a pytest junit report (the first, when it has two)."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                found.setdefault(node_id(case), child.get("message") or child.tag)
    return found


def counts(results: Mapping[str, str]) -> Counts:
    values = list(results.values())
    return Counts(values.count(PASSED), values.count(FAILED), values.count(SKIPPED))


def regressions(baseline: Mapping[str, str], other: Mapping[str, str]) -> list[str]:
    """The tests that pass in ``baseline`` and fail (or were never reported) in ``other``."""
    return sorted(
        t for t, o in baseline.items() if o == PASSED and other.get(t, MISSING) in (FAILED, MISSING)
    )


@dataclass(frozen=True, slots=True)
class AllowEntry:
    test: str
    configs: tuple[str, ...]
    """The configurations it holds for; ``("*",)`` for all."""
    reason: str
    line: int
    match: str | None = None
    """A regular expression the failure message must contain (``re.search``), so that the
    test failing some other way (a bug coda did not mean) is not excused; None: any."""

    def matches(self, test: str, config: str) -> bool:
        return self.test == test and (ALLOW_ALL in self.configs or config in self.configs)

    def excuses(self, message: str) -> bool:
        return self.match is None or re.search(self.match, message) is not None


class AllowlistError(ValueError):
    """A line of the allowlist that cannot be read; names the line."""


def parse_allowlist(text: str, known_configs: Iterable[str]) -> list[AllowEntry]:
    """``TEST_ID CONFIG[,CONFIG...] [match="REGEX"] REASON`` per line; ``#`` starts a
    comment; ``*`` as the configuration means every one; with ``match``, only a failure whose
    message holds REGEX is excused.  A line without a reason, naming an unknown
    configuration or with a bad REGEX is an error: an excuse must say why, and for what."""
    known = set(known_configs)
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise AllowlistError(f"line {number}: want TEST_ID CONFIGS REASON, got {raw!r}")
        test, configs_text, reason = parts
        match = None
        if m := re.match(r'match="((?:[^"\\]|\\.)*)"\s+(.*)$', reason):
            match, reason = m.group(1).replace('\\"', '"'), m.group(2)
            try:
                re.compile(match)
            except re.error as exc:
                raise AllowlistError(f"line {number}: match: {exc}") from None
        configs = tuple(c for c in configs_text.split(",") if c)
        unknown = [c for c in configs if c != ALLOW_ALL and c not in known]
        if unknown:
            raise AllowlistError(
                f"line {number}: unknown configuration {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        entries.append(AllowEntry(test, configs, reason, number, match))
    return entries


def parse_skiplist(text: str) -> dict[str, str]:
    """``FILE REASON`` per line (``#`` starts a comment): ATF test files the guard leaves
    out, each with why; a line without a reason is an error."""
    skip: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw.strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            raise AllowlistError(f"skip line {number}: want FILE REASON, got {raw!r}")
        skip[parts[0]] = parts[1]
    return skip


@dataclass(slots=True)
class Difference:
    """A test that passed in the baseline and failed in a coda configuration."""

    test: str
    config: str
    baseline: str
    verdict: str = "confirmed"
    """``confirmed`` (failed again, baseline passed again), ``flaky`` (passed on the rerun in
    the coda configuration, or failed on the rerun in the baseline) or ``allowed``."""
    reason: str = ""
    """The allowlist's reason (allowed), or what the rerun showed (flaky)."""
    message: str = ""
    """pytest's failure message from the rerun (or the first run)."""
    coda_log: list[str] = field(default_factory=list)
    """slurmctld's ``coda:`` lines logged while the test ran again alone."""

    @property
    def fails_guard(self) -> bool:
        return self.verdict == "confirmed"


def apply_allowlist(diffs: Sequence[Difference], allow: Sequence[AllowEntry]) -> list[AllowEntry]:
    """Mark confirmed differences the allowlist excuses; return its entries that excused
    nothing (worth a look: the difference may be gone)."""
    used: set[int] = set()
    for d in diffs:
        for entry in allow:
            if not entry.matches(d.test, d.config):
                continue
            used.add(entry.line)
            if d.verdict != "confirmed":
                break
            if entry.excuses(d.message):
                d.verdict, d.reason = "allowed", entry.reason
            else:
                d.reason = (
                    f"allowlist line {entry.line} excuses only a failure matching {entry.match!r}"
                )
            break
    return [e for e in allow if e.line not in used]


@dataclass(slots=True)
class Summary:
    """What one run of the guard found; written as summary.json for tests/matrix.py."""

    slurm: str
    status: str
    """``passed``, ``FAILED`` or ``SKIPPED`` (testsuite unavailable here)."""
    reason: str = ""
    testsuite: str = ""
    wall_s: float = 0.0
    configs: dict[str, dict[str, float | int | str]] = field(default_factory=dict)
    """Per configuration: its counts and the wall time of its pass."""
    differences: list[Difference] = field(default_factory=list)
    unused_allowlist: list[str] = field(default_factory=list)

    def write(self, out: Path) -> None:
        (out / SUMMARY_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")


def load_summary(path: Path) -> Summary:
    data = json.loads(path.read_text())
    data["differences"] = [Difference(**d) for d in data.get("differences", [])]
    return Summary(**data)


def details(summary: Summary) -> str:
    """Each configuration's passed/failed/skipped and the differences (or why it was
    skipped), on one line."""
    if summary.status == "SKIPPED":
        return summary.reason
    parts = [
        f"{name} {c.get('passed', 0)}/{c.get('failed', 0)}/{c.get('skipped', 0)}"
        for name, c in summary.configs.items()
    ]
    confirmed = [d for d in summary.differences if d.verdict == "confirmed"]
    allowed = [d for d in summary.differences if d.verdict == "allowed"]
    flaky = [d for d in summary.differences if d.verdict == "flaky"]
    verdict = f"{len(confirmed)} differences"
    if allowed or flaky:
        verdict += f" ({len(allowed)} allowed, {len(flaky)} flaky)"
    if confirmed:
        verdict += ": " + ", ".join(f"{d.test} [{d.config}]" for d in confirmed)
    if summary.reason and summary.status == "FAILED" and not confirmed:
        verdict += f"; {summary.reason}"
    return f"{', '.join(parts)}; {verdict}"


def one_line(summary: Summary) -> str:
    """The guard's outcome on one line: its status, then :func:`details`."""
    return f"{summary.status}: {details(summary)}"
