"""The version matrix's own logic (tests/matrix.py): which legs run what, how their reports
add up, and what the summary says.  Running the legs is what ``bash scripts/test`` does."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.matrix import (
    HOST_ONLY_MARKER,
    HOST_TESTS,
    ROOT_TESTS,
    SLURM_TESTS,
    Counts,
    Leg,
    Outcome,
    exit_status,
    leg_outcome,
    parse_junit,
    plan,
    requested_versions,
    split_marker,
    summary,
    translate_paths,
)

SUITES = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
KNOWN = list(SUITES)


HOST_NOTE = "tests that need no Slurm, in .venv"


def test_every_version_is_a_package_leg_and_the_host_runs_what_needs_no_slurm() -> None:
    legs = plan(KNOWN, "22.05", SUITES, None)
    assert legs == [
        Leg("22.05", None, f"{HOST_TESTS} or {HOST_ONLY_MARKER}", HOST_NOTE),
        Leg("22.05", "bookworm", ROOT_TESTS, "packages"),
        Leg("24.11", "trixie", ROOT_TESTS, "packages"),
        Leg("26.05", "sid", ROOT_TESTS, "packages"),
    ]


def test_a_debian_13_host_tests_every_version_in_its_root() -> None:
    legs = plan(KNOWN, "24.11", SUITES, None)
    assert [(leg.version, leg.suite) for leg in legs] == [
        ("24.11", None),
        ("22.05", "bookworm"),
        ("24.11", "trixie"),
        ("26.05", "sid"),
    ]


def test_another_version_alone_leaves_the_host_only_the_tests_that_need_no_slurm() -> None:
    legs = plan(["24.11"], "22.05", SUITES, None)
    assert legs == [
        Leg("22.05", None, HOST_TESTS, HOST_NOTE),
        Leg("24.11", "trixie", ROOT_TESTS, "packages"),
    ]


def test_the_roots_leave_the_host_only_tests_out() -> None:
    # The Prometheus test needs Debian's prometheus, which only the host installs.
    def runs_in_a_root(*markers: str) -> bool:
        return Expression.compile(ROOT_TESTS).evaluate(lambda m: m in markers)

    assert runs_in_a_root("slurm") and runs_in_a_root("compiled")
    assert not runs_in_a_root("slurm", "prometheus")
    assert all(leg.marker == ROOT_TESTS for leg in plan(KNOWN, "22.05", SUITES, None)[1:])
    # and the host runs them, beside the tests that need no Slurm
    host = plan(KNOWN, "22.05", SUITES, None)[0].marker
    assert Expression.compile(host).evaluate(lambda m: m in ("slurm", "prometheus"))
    assert not Expression.compile(host).evaluate(lambda m: m == "slurm")


def test_the_users_marker_narrows_every_leg() -> None:
    host, root = plan(["24.11"], "22.05", SUITES, "not gpu")
    assert host.marker == f"({HOST_TESTS}) and (not gpu)"
    assert root.marker == f"({ROOT_TESTS}) and (not gpu)"


@pytest.mark.parametrize(
    "args,marker,rest",
    [
        (["-x", "tests/test_tres.py"], None, ["-x", "tests/test_tres.py"]),
        (["-m", "slurm", "-k", "reserve"], "slurm", ["-k", "reserve"]),
        (["-mnot gpu", "-m", "slurm"], "slurm", []),
        (["--maxfail=1"], None, ["--maxfail=1"]),
    ],
)
def test_split_marker(args: list[str], marker: str | None, rest: list[str]) -> None:
    assert split_marker(args) == (marker, rest)


def test_paths_into_the_checkout_are_the_roots_paths(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_x.py").touch()
    inside = Path("/srv/coda")
    args = [
        f"{repo}/tests/test_x.py::test_one",
        str(repo / "tests"),
        "tests/test_x.py",
        "-k",
        "reserve",
        "/elsewhere/test_y.py",
        f"--rootdir={repo}",
    ]
    assert translate_paths(args, repo, inside) == [
        "/srv/coda/tests/test_x.py::test_one",
        "/srv/coda/tests",
        "tests/test_x.py",
        "-k",
        "reserve",
        "/elsewhere/test_y.py",
        f"--rootdir={repo}",
    ]


@pytest.mark.parametrize(
    "value,picked",
    [(None, KNOWN), ("", KNOWN), ("24.11", ["24.11"]), ("26.05, 22.05 26.05", ["26.05", "22.05"])],
)
def test_requested_versions(value: str | None, picked: list[str]) -> None:
    assert requested_versions(value, KNOWN) == picked


def test_an_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"names 23\.02; known: 22\.05, 24\.11, 26\.05"):
        requested_versions("23.02", KNOWN)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest"
errors="{errors}" failures="{failures}" skipped="{skipped}" tests="{tests}" time="1.0">
</testsuite></testsuites>"""


def junit(tmp_path: Path, **counts: int) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT.format(**{"errors": 0, "failures": 0, "skipped": 0, **counts}))
    return path


def test_junit_errors_count_as_failures(tmp_path: Path) -> None:
    assert parse_junit(junit(tmp_path, tests=10, failures=2, errors=1, skipped=3)) == Counts(
        4, 3, 3
    )


ROOT = Leg("24.11", "trixie", SLURM_TESTS)


def test_no_tests_collected_is_a_passed_leg_that_says_so(tmp_path: Path) -> None:
    out = leg_outcome(ROOT, 5, junit(tmp_path, tests=0), 3.0)
    assert (out.result, out.counts, out.note) == ("passed", Counts(), "no tests collected")


def test_a_leg_without_a_report_failed_even_if_it_exited_0(tmp_path: Path) -> None:
    out = leg_outcome(ROOT, 0, tmp_path / "missing.xml", 3.0)
    assert (out.result, out.counts, out.note) == ("FAILED", None, "no test report")


def test_an_interrupted_leg_failed(tmp_path: Path) -> None:
    out = leg_outcome(ROOT, 2, junit(tmp_path, tests=4), 3.0, "setup 50s")
    assert (out.result, out.note) == ("FAILED", "setup 50s; pytest exited 2")


def outcomes() -> list[Outcome]:
    return [
        Outcome(Leg("22.05", None, None), "passed", Counts(800, 0, 9), 425.0),
        Outcome(ROOT, "FAILED", Counts(50, 16, 0), 131.0, "setup 48s"),
        Outcome(
            Leg("26.05", "sid", SLURM_TESTS), "SKIPPED", None, 4.0, "debootstrap sid failed: x"
        ),
    ]


def test_the_summary_is_a_table_per_version_and_the_totals_alone_last() -> None:
    text = summary(outcomes(), "bookworm")
    lines = text.splitlines()
    assert lines[-1] == "850 passed, 16 failed, 9 skipped"
    assert lines[1].split() == [
        "Slurm", "where", "result", "passed", "failed", "skipped", "time"
    ]  # fmt: skip
    assert lines[2].split() == ["22.05", "host", "(bookworm)", "passed", "800", "0", "9", "7m05s"]
    assert lines[3].split()[:8] == ["24.11", "trixie", "root", "FAILED", "50", "16", "0", "2m11s"]
    assert lines[3].endswith("setup 48s")
    assert lines[4].split()[:4] == ["26.05", "sid", "root", "SKIPPED"]
    assert lines[4].endswith("debootstrap sid failed: x")


def test_a_failed_leg_fails_the_run_and_a_skipped_one_does_not() -> None:
    assert exit_status(outcomes()) == 1
    passed, _, skipped = outcomes()
    assert exit_status([passed, skipped]) == 0


def test_nothing_collected_anywhere_is_pytests_exit_5() -> None:
    empty = Outcome(ROOT, "passed", Counts(), 3.0, "no tests collected")
    assert exit_status([empty, empty]) == 5
