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
marked ``cgroup_v2_node`` run on a real cgroup v2 node: a QEMU guest of this host's Debian
release with its Slurm (tests/cgroup-v2-guest), when this host's Slurm is picked and the
arguments do not leave them out.  The last line is ``N passed, N failed, N skipped`` over
every leg; the exit status is 1 when a leg failed.
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
from dataclasses import dataclass
from pathlib import Path

from slurm_plugin.devtools.cluster import DevClusterError, slurm_version

REPO = Path(__file__).resolve().parent.parent
SLURM_ROOT = REPO / "tests" / "slurm-root"
PACKAGE_LEG = "tests/package-leg"
"""The leg's script, run at the top of the checkout's copy inside a root."""
GUEST = REPO / "tests" / "cgroup-v2-guest"
V2_MARKER = "cgroup_v2_node"
V2_TESTS = "test_node_cgroup_v2"
"""The module of the cgroup v2 node tests: named paths that leave it out skip the guest."""
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


@dataclass(frozen=True, slots=True)
class Leg:
    version: str
    suite: str | None
    """The Debian root's suite; None on the host (and in the host's cgroup v2 guest)."""
    marker: str | None
    """pytest's ``-m`` for this leg (the user's own ``-m`` already folded in)."""
    note: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    leg: Leg
    result: str
    """``passed``, ``FAILED`` or ``SKIPPED``."""
    counts: Counts | None
    wall_s: float
    note: str = ""


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
) -> list[Leg]:
    """The host leg first (the tests that need no Slurm; with its own Slurm picked, the
    host-only Slurm tests too), then one package leg in a root for each picked version."""
    if host_version in versions:
        host = Leg(host_version, None, combine(f"{HOST_TESTS} or {HOST_ONLY_MARKER}", user_marker))
    else:
        host = Leg(host_version or "?", None, combine(HOST_TESTS, user_marker))
    legs = [Leg(host.version, None, host.marker, "tests that need no Slurm, in .venv")]
    if user_marker and V2_MARKER in user_marker and "slurm" not in user_marker:
        return legs  # only the guest's tests: no root has any
    legs += [Leg(v, suites[v], combine(ROOT_TESTS, user_marker), "packages") for v in versions]
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


def exit_status(outcomes: Sequence[Outcome]) -> int:
    if any(o.result == "FAILED" for o in outcomes):
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
    return ["-q", "-ra", *marker, *args, f"--junitxml={junit}"]


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


def run_host(leg: Leg, args: Sequence[str], reports: Path) -> Outcome:
    junit = reports / "host.xml"
    banner(f"Slurm {leg.version} on this host: pytest {shlex.join(pytest_args(leg, args, junit))}")
    start = time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", *pytest_args(leg, args, junit)])
    return leg_outcome(leg, status, junit, time.monotonic() - start)


def run_root(leg: Leg, args: Sequence[str]) -> Outcome:
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
    status = subprocess.call([*script, f"/{ROOT_REPORT_DIR}", *inner])
    wall_s = time.monotonic() - start
    notes = [f"root built in {duration(build_s)}"] if build_s >= 5 else []
    if (reports / "failed").exists():
        step = (reports / "failed").read_text().strip()
        return Outcome(leg, "FAILED", None, wall_s, f"{step} failed")
    for name, what in (("build-s", "packages built"), ("install-s", "installed")):
        if (reports / name).exists():
            notes.append(f"{what} at {duration(float((reports / name).read_text()))}")
    return leg_outcome(leg, status, reports / "junit.xml", wall_s, ", ".join(notes))


def run_guest(leg: Leg, args: Sequence[str], reports: Path) -> Outcome:
    out = reports / "guest"
    marker = combine(V2_MARKER, leg.marker)
    inner = ["-p", "no:cacheprovider", "-q", "-ra", "-m", marker, *args]
    banner(f"Slurm {leg.version} on a cgroup v2 node (QEMU guest): pytest {shlex.join(inner)}")
    start = time.monotonic()
    command = 'exec .venv/bin/python -m pytest "$@" --junitxml="$CODA_GUEST_OUT/junit.xml"'
    status = subprocess.call(
        [str(GUEST), "run", "bash", "-c", command, "bash", *inner],
        env={**os.environ, "CODA_GUEST_OUT": str(out)},
    )
    wall_s = time.monotonic() - start
    if status == ROOT_UNAVAILABLE:
        return Outcome(leg, "SKIPPED", None, wall_s, "the guest cannot be built here (no mirror)")
    return leg_outcome(leg, status, out / "junit.xml", wall_s)


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
    legs = plan(versions, host_version, suites, user_marker)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="coda-matrix-") as reports:
        for leg in legs:
            if leg.suite is None:
                outcomes.append(run_host(leg, args, Path(reports)))
            else:
                outcomes.append(run_root(leg, args))
        if host_version in versions and wants_guest(args, user_marker):
            guest = Leg(host_version or "?", None, user_marker, "cgroup v2 node (QEMU guest)")
            outcomes.append(run_guest(guest, args, Path(reports)))
    print("\n" + summary(outcomes, host_name()), flush=True)
    return exit_status(outcomes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
