"""The Slurm version matrix: the tests that need no Slurm on this host (its virtualenv, the
developers' install), and the Slurm-facing tests on every supported Slurm in a Debian root
(tests/slurm-root) against coda's own Debian packages, installed there as an admin installs
them (tests/package-leg).

    .venv/bin/python -m tests.matrix [PYTEST ARGS...]        (bash scripts/test runs this)

``CODA_SLURM_VERSIONS`` (e.g. ``24.11`` or ``22.05,26.05``) picks the versions; the default
is every version tests/slurm-root knows, this host's own included.  The host runs the tests
of the given paths that need no Slurm, and, when its own Slurm is picked, those marked
``prometheus`` (they test the dashboard, not Slurm, and need Debian's prometheus, which only
the host installs).  Each picked version is a leg in its root: tests/package-leg installs
Debian's Slurm, builds coda's packages from this checkout with scripts/build-debs, installs
them with apt and runs the tests marked ``slurm`` or ``compiled`` on Debian's python3 against
what is installed.  A root that cannot be built here (exit 3 from tests/slurm-root: no
mirror) is a SKIPPED leg with debootstrap's reason in the table; it does not fail the run
(``CODA_REQUIRE_SLURM=1`` makes a Slurm missing *inside* a leg a failure).  Last, the tests
marked ``cgroup_v2_node`` run on a real cgroup v2 node, unless the arguments leave them out:
one QEMU guest (tests/cgroup-v2-guest) runs each picked version's root in turn, with the
packages its leg installed, in each configuration the guest knows (26.05 with
``CgroupJobIdPaths`` no and yes, ``IgnoreSystemd=yes``, two slurmd); each is a row of the
table, after the legs (skipped where the leg installed no packages).  A version the guest runs
on v2 whose Debian release no longer boots cgroup v1 (``V1_VERSIONS``) leaves coda-node's
tests on the host's v1 (``V1_NODE_TESTS``) out of its leg unless they are named; with only
the guest's tests asked for (``-m cgroup_v2_node``) the legs still install the packages.
On a run without pytest arguments, SchedMD's own testsuite guard (tests/schedmd/run-suite:
Slurm's ATF with and without job_submit/coda) runs after the tests of the host leg, when its
Slurm is picked, and of every other version's leg (tests/package-leg --schedmd-guard);
``CODA_SCHEDMD_GUARD=1`` runs it on those legs whatever the arguments, ``0`` never.  Its
line per leg comes after the table; a difference it finds fails the run, a testsuite it
cannot fetch here is a skip.  The last line is ``N passed, N failed, N skipped`` over every
leg; the exit status is 1 when a leg or a guard failed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_plugin.devtools.cluster import DevClusterError, slurm_version
from tests.schedmd.compare import SUMMARY_FILE, Counts, details, load_summary

REPO = Path(__file__).resolve().parent.parent
SLURM_ROOT = REPO / "tests" / "slurm-root"
PACKAGE_LEG = "tests/package-leg"
"""The leg's script, run at the top of the checkout's copy inside a root."""
GUEST = REPO / "tests" / "cgroup-v2-guest"
V2_MARKER = "cgroup_v2_node"
V2_TESTS = "test_node_cgroup_v2"
"""The module of the cgroup v2 node tests: named paths that leave it out skip the guest."""
V2_MODULE = f"tests/node/{V2_TESTS}.py"
V1_NODE_TESTS = (
    "tests/node/test_node_slurm.py",
    "tests/node/test_node_recovery_slurm.py",
    "tests/node/test_node_faults_slurm.py",
    "tests/node/test_node_loop_slurm.py",
)
"""coda-node against a real Slurm on the host's cgroup v1 (a confined dev cluster)."""
V1_VERSIONS = ("22.05",)
"""The versions whose Debian release boots cgroup v1: bookworm (systemd 252). trixie's
systemd 257 refuses v1 unless forced and sid's (258 on) has none, so coda-node meets 24.11
and 26.05 on v2, where the guest runs them; V1_NODE_TESTS run on these versions' legs."""
GUEST_UNAVAILABLE = 3
"""tests/cgroup-v2-guest's exit status for "the guest cannot be built here"."""
ROOT_CHECKOUT = Path("/srv/coda")
"""Where tests/slurm-root puts this checkout inside a root."""
ROOT_REPORT_DIR = "var/tmp/coda-matrix"
"""The leg's reports inside a root (relative to the root), read from the host after it."""
SLURM_TESTS = "slurm or compiled"
"""The tests that depend on the Slurm they run against: a real cluster, or the plugin
module built against its slurm.h loaded in-process."""
HOST_ONLY_MARKER = "prometheus"
"""Slurm tests that do not depend on the Slurm version and need a heavy package the version
roots do not install (Debian's prometheus): they run on the host leg only."""
HOST_TESTS = f"not ({SLURM_TESTS})"
"""What the host runs: the tests that need no Slurm."""
ROOT_TESTS = f"({SLURM_TESTS}) and not {HOST_ONLY_MARKER}"
"""What a version root runs."""
ROOT_UNAVAILABLE = 3
"""tests/slurm-root's exit status for "this root cannot be built here"."""
PYTEST_NO_TESTS = 5
GUARD = REPO / "tests" / "schedmd" / "run-suite"
"""SchedMD's testsuite with and without coda (tests/schedmd/guard.py)."""
GUARD_ENV = "CODA_SCHEDMD_GUARD"
GUARD_REPORT_DIR = "schedmd"
"""The guard's reports in a leg's report folder (package-leg writes it in the root's)."""


@dataclass(frozen=True, slots=True)
class Leg:
    version: str
    suite: str | None
    """The Debian root's suite; None on the host (and in the host's cgroup v2 guest)."""
    marker: str | None
    """pytest's ``-m`` for this leg (the user's own ``-m`` already folded in)."""
    note: str = ""
    ignore: tuple[str, ...] = ()
    """Test modules left out of this leg (pytest's ``--ignore``)."""
    where: str = ""
    """Where it ran, when neither this host nor a root (the cgroup v2 guest)."""


@dataclass(frozen=True, slots=True)
class GuestConfig:
    """One configuration of the cgroup v2 guest, a line of ``tests/cgroup-v2-guest configs``."""

    name: str
    version: str
    suite: str
    settings: str
    """cgroup.conf lines (``-``: none), or ``slurmds=N``."""
    what: str
    """What it shows, in words."""


@dataclass(frozen=True, slots=True)
class Guard:
    """What the SchedMD testsuite guard said on a leg."""

    result: str
    """``passed``, ``FAILED`` or ``SKIPPED`` (the testsuite cannot be had here)."""
    line: str
    """Each configuration's passed/failed/skipped and the differences (compare.details)."""
    wall_s: float


@dataclass(frozen=True, slots=True)
class Outcome:
    leg: Leg
    result: str
    """``passed``, ``FAILED`` or ``SKIPPED``."""
    counts: Counts | None
    wall_s: float
    note: str = ""
    guard: Guard | None = None


def parse_junit(path: Path) -> Counts:
    """Test counts from a pytest junit XML report; errors count as failures."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = Counts()
    for s in suites:
        tests, skipped = int(s.get("tests", 0)), int(s.get("skipped", 0))
        failed = int(s.get("failures", 0)) + int(s.get("errors", 0))
        counts += Counts(tests - failed - skipped, failed, skipped)
    return counts


def split_marker(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The user's ``-m EXPR`` (the last one, as pytest takes it) and the other arguments."""
    marker: str | None = None
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "-m":
            marker = next(it, None)
        elif arg.startswith("-m") and not arg.startswith("--"):
            marker = arg[2:]
        else:
            rest.append(arg)
    return marker, rest


def combine(base: str | None, user: str | None) -> str | None:
    if base and user:
        return f"({base}) and ({user})"
    return base or user


def plan(
    versions: Sequence[str],
    host_version: str | None,
    suites: dict[str, str],
    user_marker: str | None,
    guest_versions: Sequence[str] = (),
    named: Sequence[str] = (),
) -> list[Leg]:
    """The host leg first (the tests that need no Slurm; with its own Slurm picked, the
    host-only Slurm tests too), then one package leg in a root for each picked version.
    ``guest_versions`` are those the cgroup v2 guest runs after the legs: a leg of one
    that no longer meets cgroup v1 leaves V1_NODE_TESTS out (but those in ``named``, the
    paths asked for); with only the guest's tests asked for, the legs are those versions',
    for their packages."""
    if host_version in versions:
        host = Leg(host_version, None, combine(f"{HOST_TESTS} or {HOST_ONLY_MARKER}", user_marker))
    else:
        host = Leg(host_version or "?", None, combine(HOST_TESTS, user_marker))
    legs = [Leg(host.version, None, host.marker, "tests that need no Slurm, in .venv")]
    if user_marker and V2_MARKER in user_marker and "slurm" not in user_marker:
        # Only the guest's tests: no root has any, but the guest runs what the legs install.
        versions = [v for v in versions if v in guest_versions]
    for v in versions:
        ignore: tuple[str, ...] = ()
        note = "packages"
        if v in guest_versions and v not in V1_VERSIONS:
            ignore = tuple(t for t in V1_NODE_TESTS if t not in named)
            note = "packages; coda-node on cgroup v2 only (the guest)" if ignore else note
        legs.append(Leg(v, suites[v], combine(ROOT_TESTS, user_marker), note, ignore))
    return legs


def wants_guest(args: Sequence[str], user_marker: str | None) -> bool:
    """Whether the cgroup v2 node tests are among those asked for: no paths, or a path that
    holds them; and no ``-m`` that leaves their marker out."""
    paths = [a.partition("::")[0] for a in args if not a.startswith("-")]
    paths = [a for a in paths if os.path.exists(a)]
    if paths and not any(V2_TESTS in a or Path(a).is_dir() for a in paths):
        return False
    return user_marker is None or V2_MARKER in user_marker


def translate_paths(args: Sequence[str], repo: Path, inside: Path) -> list[str]:
    """Absolute paths into this checkout, as the root sees them (``PATH[::test]`` too);
    relative paths already mean the same in both (pytest runs at the checkout's top)."""
    repo_real = Path(os.path.realpath(repo))
    out = []
    for arg in args:
        path, sep, test = arg.partition("::")
        if not arg.startswith("-") and os.path.isabs(path):
            real = Path(os.path.realpath(path))
            if real == repo_real or repo_real in real.parents:
                arg = str(inside / real.relative_to(repo_real)) + sep + test
        out.append(arg)
    return out


def requested_versions(env_value: str | None, known: Sequence[str]) -> list[str]:
    """``CODA_SLURM_VERSIONS`` (commas or spaces), in the order given; default all known."""
    if not env_value or not env_value.strip():
        return list(known)
    picked = list(dict.fromkeys(env_value.replace(",", " ").split()))
    unknown = [v for v in picked if v not in known]
    if unknown:
        raise ValueError(
            f"CODA_SLURM_VERSIONS names {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return picked


def wants_schedmd_guard(args: Sequence[str], user_marker: str | None) -> bool:
    """Whether the legs that carry the guard run it: on a full run (no pytest arguments),
    or as ``CODA_SCHEDMD_GUARD`` (1 or 0) says."""
    forced = os.environ.get(GUARD_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return not args and user_marker is None


def read_guard(report_dir: Path, status: int) -> Guard:
    """The guard's summary.json in ``report_dir`` (its exit ``status`` when it left none)."""
    path = report_dir / SUMMARY_FILE
    if not path.exists():
        return Guard("FAILED", f"no {SUMMARY_FILE} (exit {status})", 0.0)
    summary = load_summary(path)
    line = details(summary)
    if summary.testsuite:
        # Which testsuite ran: the version's own, or the one the mirror serves instead.
        line += f" [testsuite: {summary.testsuite.split(';')[0]}]"
    return Guard(summary.status, line, summary.wall_s)


def exit_status(outcomes: Sequence[Outcome]) -> int:
    if any(o.result == "FAILED" or (o.guard and o.guard.result == "FAILED") for o in outcomes):
        return 1
    ran = [o for o in outcomes if o.counts is not None]
    if ran and sum((o.counts for o in ran), Counts()).total == 0:
        return PYTEST_NO_TESTS  # as pytest says when nothing was collected
    return 0


def duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def summary(outcomes: Sequence[Outcome], host_name: str) -> str:
    """The per-version table, then the totals alone on the last line."""
    rows = [("Slurm", "where", "result", "passed", "failed", "skipped", "time", "")]
    for o in outcomes:
        where = f"host ({host_name})" if o.leg.suite is None else f"{o.leg.suite} root"
        where = o.leg.where or where
        c = o.counts
        nums = (str(c.passed), str(c.failed), str(c.skipped)) if c else ("-", "-", "-")
        note = "; ".join(n for n in (o.leg.note, o.note) if n)
        rows.append((o.leg.version, where, o.result, *nums, duration(o.wall_s), note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    right = {3, 4, 5, 6}  # the numbers and the time
    lines = ["Slurm version matrix:"]
    for r in rows:
        cells = [r[i].rjust(w) if i in right else r[i].ljust(w) for i, w in enumerate(widths)]
        lines.append(("  " + "  ".join(cells) + "  " + r[-1]).rstrip())
    guarded = [o for o in outcomes if o.guard]
    if guarded:
        lines.append("SchedMD testsuite guard (tests/schedmd/run-suite), passed/failed/skipped:")
    for o in guarded:
        assert o.guard is not None
        where = f"host ({host_name})" if o.leg.suite is None else f"{o.leg.suite} root"
        g = o.guard
        lines.append(f"  {o.leg.version}  {where}  {g.result}  {duration(g.wall_s)}  {g.line}")
    total = sum((o.counts for o in outcomes if o.counts), Counts())
    lines.append(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return "\n".join(lines)


# -- running the legs ---------------------------------------------------------------------


def root_tool(*args: str) -> str:
    """What tests/slurm-root prints for ``versions``, ``suite VERSION`` or ``path SUITE``."""
    proc = subprocess.run([str(SLURM_ROOT), *args], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def pytest_args(leg: Leg, args: Sequence[str], junit: Path | str) -> list[str]:
    marker = ["-m", leg.marker] if leg.marker else []
    ignore = [f"--ignore={path}" for path in leg.ignore]
    return ["-q", "-ra", *marker, *ignore, *args, f"--junitxml={junit}"]


def banner(text: str) -> None:
    print(f"\n=== matrix: {text}", flush=True)


def leg_outcome(leg: Leg, status: int, junit: Path, wall_s: float, note: str = "") -> Outcome:
    counts = parse_junit(junit) if junit.exists() else None
    notes = [note]
    if status == PYTEST_NO_TESTS:
        notes.append("no tests collected")
        status = 0
    elif status not in (0, 1):
        notes.append(f"pytest exited {status}")
    if counts is None and status == 0:
        status, notes = 1, [*notes, "no test report"]
    result = "passed" if status == 0 else "FAILED"
    return Outcome(leg, result, counts, wall_s, "; ".join(n for n in notes if n))


def run_host(leg: Leg, args: Sequence[str], reports: Path, guard: bool = False) -> Outcome:
    junit = reports / "host.xml"
    banner(f"Slurm {leg.version} on this host: pytest {shlex.join(pytest_args(leg, args, junit))}")
    start = time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", *pytest_args(leg, args, junit)])
    outcome = leg_outcome(leg, status, junit, time.monotonic() - start)
    if not guard:
        return outcome
    out = reports / GUARD_REPORT_DIR
    banner(
        f"Slurm {leg.version} on this host: SchedMD's testsuite guard, {GUARD.relative_to(REPO)}"
    )
    status = subprocess.call([str(GUARD), "--out", str(out)])
    return replace(outcome, guard=read_guard(out, status))


def run_root(leg: Leg, args: Sequence[str], guard: bool = False) -> Outcome:
    assert leg.suite is not None
    inside = translate_paths(args, REPO, ROOT_CHECKOUT)
    inner = pytest_args(leg, inside, f"/{ROOT_REPORT_DIR}/junit.xml")
    banner(
        f"Slurm {leg.version} in the {leg.suite} root: coda's packages built and installed, "
        f"then pytest {shlex.join(inner)}"
    )
    start = time.monotonic()
    build = subprocess.run([str(SLURM_ROOT), "build", leg.suite], stderr=subprocess.PIPE, text=True)
    sys.stderr.write(build.stderr)
    build_s = time.monotonic() - start
    if build.returncode != 0:
        reason = (build.stderr.strip().splitlines() or [f"exit {build.returncode}"])[-1]
        result = "SKIPPED" if build.returncode == ROOT_UNAVAILABLE else "FAILED"
        return Outcome(leg, result, None, build_s, reason.removeprefix("slurm-root: "))
    reports = Path(root_tool("path", leg.suite)) / ROOT_REPORT_DIR
    shutil.rmtree(reports, ignore_errors=True)  # no report from an earlier run is read as ours
    script = [str(SLURM_ROOT), "run", leg.suite, "bash", PACKAGE_LEG]
    if guard:
        script.append("--schedmd-guard")
    status = subprocess.call([*script, f"/{ROOT_REPORT_DIR}", *inner])
    wall_s = time.monotonic() - start
    notes = [f"root built in {duration(build_s)}"] if build_s >= 5 else []
    if (reports / "failed").exists():
        step = (reports / "failed").read_text().strip()
        return Outcome(leg, "FAILED", None, wall_s, f"{step} failed")
    for name, what in (("build-s", "packages built"), ("install-s", "installed")):
        if (reports / name).exists():
            notes.append(f"{what} at {duration(float((reports / name).read_text()))}")
    outcome = leg_outcome(leg, status, reports / "junit.xml", wall_s, ", ".join(notes))
    if not guard:
        return outcome
    return replace(outcome, guard=read_guard(reports / GUARD_REPORT_DIR, status))


def guest_configs() -> list[GuestConfig]:
    proc = subprocess.run([str(GUEST), "configs"], capture_output=True, text=True, check=True)
    return parse_guest_configs(proc.stdout)


def parse_guest_configs(text: str) -> list[GuestConfig]:
    """``NAME VERSION SUITE SETTINGS WHAT...``, a configuration a line."""
    rows = (line.split(maxsplit=4) for line in text.splitlines())
    return [GuestConfig(*row) for row in rows if len(row) == 5]


def named_paths(args: Sequence[str]) -> list[str]:
    """The test paths among pytest's arguments, relative to the checkout's top."""
    paths = [a.partition("::")[0] for a in args if not a.startswith("-")]
    repo = os.path.realpath(REPO)
    return [os.path.relpath(os.path.realpath(a), repo) for a in paths if os.path.exists(a)]


def guest_outcomes(
    configs: Sequence[GuestConfig], marker: str | None, out: Path, status: int
) -> list[Outcome]:
    """Each configuration's row from what tests/cgroup-v2-guest left in ``out``; the
    first says how long the guest took to boot, which no row's time holds."""

    def read(path: Path) -> str:
        return path.read_text().strip() if path.exists() else ""

    kernel = read(out / "guest" / "kernel").partition("+")[0]
    boot_s = read(out / "guest" / "boot-s")
    outcomes = []
    for c in configs:
        where = f"v2 guest, {kernel}" if kernel else "v2 guest"
        leg = Leg(c.version, c.suite, combine(V2_MARKER, marker), c.what, where=where)
        d = out / c.name
        if status == GUEST_UNAVAILABLE:
            outcomes.append(Outcome(leg, "SKIPPED", None, 0.0, "the guest cannot be built here"))
            continue
        if (d / "skipped").exists():
            outcomes.append(Outcome(leg, "SKIPPED", None, 0.0, read(d / "skipped")))
            continue
        notes = [read(d / "failed")]
        if boot_s and not any(o.result != "SKIPPED" for o in outcomes):
            notes.append(f"guest booted in {duration(float(boot_s))}")
        rc = read(d / "rc")
        if not rc:
            notes.append("did not finish")
        wall_s = float(read(d / "wall-s") or 0)
        note = "; ".join(n for n in notes if n)
        outcomes.append(leg_outcome(leg, int(rc or 1), d / "junit.xml", wall_s, note))
    return outcomes


def run_guest(
    configs: Sequence[GuestConfig], marker: str | None, args: Sequence[str], reports: Path
) -> list[Outcome]:
    out = reports / "guest"
    inside = translate_paths(args, REPO, ROOT_CHECKOUT)
    module = [] if named_paths(args) else [V2_MODULE]  # collecting every module is slow there
    inner = ["-q", "-ra", "-m", combine(V2_MARKER, marker) or V2_MARKER, *inside, *module]
    names = ", ".join(c.name for c in configs)
    banner(f"cgroup v2 node (QEMU guest), configurations {names}: pytest {shlex.join(inner)}")
    status = subprocess.call(
        [str(GUEST), "run", *inner],
        env={
            **os.environ,
            "CODA_GUEST_OUT": str(out),
            "CODA_GUEST_CONFIGS": ",".join(c.name for c in configs),
        },
    )
    return guest_outcomes(configs, marker, out, status)


def host_slurm() -> str | None:
    try:
        major, minor = slurm_version()
    except DevClusterError:
        return None
    return f"{major}.{minor:02d}"


def host_name() -> str:
    fields = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            fields[key] = value.strip('"')
    except OSError:
        pass
    return fields.get("VERSION_CODENAME") or fields.get("ID") or "unknown OS"


def main(argv: Sequence[str]) -> int:
    known = root_tool("versions").split()
    try:
        versions = requested_versions(os.environ.get("CODA_SLURM_VERSIONS"), known)
    except ValueError as exc:
        print(f"matrix: {exc}", file=sys.stderr)
        return 2
    user_marker, args = split_marker(argv)
    suites = {v: root_tool("suite", v) for v in versions}
    host_version = host_slurm()
    configs = guest_configs() if wants_guest(args, user_marker) else []
    configs = [c for c in configs if c.version in versions]
    guest_versions = [c.version for c in configs]
    legs = plan(versions, host_version, suites, user_marker, guest_versions, named_paths(args))
    guard = wants_schedmd_guard(args, user_marker)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="coda-matrix-") as reports:
        for leg in legs:
            if leg.suite is None:
                outcomes.append(
                    run_host(leg, args, Path(reports), guard and host_version in versions)
                )
            else:
                outcomes.append(run_root(leg, args, guard and leg.version != host_version))
        # A configuration runs what its version's leg installed: none where pytest never ran.
        installed = {o.leg.version for o in outcomes if o.leg.suite and o.counts is not None}
        ready = [c for c in configs if c.version in installed]
        guest = run_guest(ready, user_marker, args, Path(reports)) if ready else []
        for c in configs:
            if c in ready:
                outcomes.append(guest[ready.index(c)])
            else:
                leg = Leg(c.version, c.suite, V2_MARKER, c.what, where="v2 guest")
                why = f"coda's packages were not installed ({c.suite} leg)"
                outcomes.append(Outcome(leg, "SKIPPED", None, 0.0, why))
    print("\n" + summary(outcomes, host_name()), flush=True)
    return exit_status(outcomes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
