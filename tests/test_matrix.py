"""The version matrix's own logic (tests/matrix.py): which legs run what, how their reports
add up, and what the summary says.  Running the legs is what ``bash scripts/test`` does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.matrix import (
    GUEST,
    GUEST_UNAVAILABLE,
    HOST_ONLY_MARKER,
    HOST_TESTS,
    ROOT_TESTS,
    SLURM_ROOT,
    SLURM_TESTS,
    V1_NODE_TESTS,
    V2_MARKER,
    Counts,
    GuestConfig,
    Leg,
    Outcome,
    exit_status,
    guest_configs,
    guest_outcomes,
    leg_outcome,
    parse_guest_configs,
    parse_junit,
    plan,
    pytest_args,
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
        (["-x", "tests/controller/test_tres.py"], None, ["-x", "tests/controller/test_tres.py"]),
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


# -- the cgroup v2 guest ------------------------------------------------------------------


def test_one_guest_runs_every_version_and_26_05_both_ways() -> None:
    configs = guest_configs()
    known = subprocess.run([str(SLURM_ROOT), "versions"], capture_output=True, text=True)
    assert {c.version for c in configs} == set(known.stdout.split())
    for c in configs:
        assert SUITES[c.version] == c.suite, c
    # Every test on every version (26.05 as it names job directories by default); the
    # configurations that differ only in how Slurm makes its tree run the tree's tests:
    # 26.05's job directories named by job id, slurmd without systemd, two slurmd.
    full = [(c.version, c.settings) for c in configs if "tests=tree" not in c.settings]
    assert sorted(v for v, _ in full) == sorted(SUITES)
    assert {s for v, s in full if v == "26.05"} == {"-"}
    on_26_05 = {s for c in configs if c.version == "26.05" for s in c.settings.split(",")}
    assert {"CgroupJobIdPaths=yes", "IgnoreSystemd=yes", "slurmds=2"} <= on_26_05
    assert len({c.name for c in configs}) == len(configs)
    # The guest boots once for all of them: its configurations are rows of one run.
    assert "run [PYTEST ARGS]" in GUEST.read_text()


def test_guest_configs_are_parsed_a_line_each() -> None:
    text = "26.05 26.05 sid - SLUID directories\n\n24.11-x 24.11 trixie IgnoreSystemd=yes a b\n"
    assert parse_guest_configs(text) == [
        GuestConfig("26.05", "26.05", "sid", "-", "SLUID directories"),
        GuestConfig("24.11-x", "24.11", "trixie", "IgnoreSystemd=yes", "a b"),
    ]


def test_versions_the_guest_runs_on_v2_leave_the_v1_node_tests_to_22_05() -> None:
    legs = plan(KNOWN, "22.05", SUITES, None, guest_versions=KNOWN)
    ignored = {leg.suite: leg.ignore for leg in legs[1:]}
    assert ignored == {"bookworm": (), "trixie": V1_NODE_TESTS, "sid": V1_NODE_TESTS}
    assert all(Path(t).exists() for t in V1_NODE_TESTS)
    assert "--ignore=tests/node/test_node_slurm.py" in pytest_args(legs[2], [], "j.xml")
    # Without the guest (or with the modules named) every leg runs them.
    assert all(leg.ignore == () for leg in plan(KNOWN, "22.05", SUITES, None))
    named = plan(KNOWN, "22.05", SUITES, None, KNOWN, ["tests/node/test_node_slurm.py"])
    assert "tests/node/test_node_slurm.py" not in named[2].ignore
    assert "tests/node/test_node_loop_slurm.py" in named[2].ignore


def test_only_the_guests_tests_still_install_the_packages_it_runs() -> None:
    legs = plan(KNOWN, "22.05", SUITES, V2_MARKER, guest_versions=["24.11", "26.05"])
    assert [(leg.version, leg.suite) for leg in legs] == [
        ("22.05", None),
        ("24.11", "trixie"),
        ("26.05", "sid"),
    ]
    assert legs[1].marker == f"({ROOT_TESTS}) and ({V2_MARKER})"  # collects nothing there


CONFIGS = [
    GuestConfig("24.11", "24.11", "trixie", "-", "job_<id> directories"),
    GuestConfig("26.05", "26.05", "sid", "-", "SLUID directories"),
    GuestConfig("26.05-jobid", "26.05", "sid", "CgroupJobIdPaths=yes", "job_<id>"),
]


def guest_out(tmp_path: Path) -> Path:
    out = tmp_path / "guest-out"
    (out / "guest").mkdir(parents=True)
    (out / "guest" / "kernel").write_text("6.12.117+deb13-amd64\n")
    (out / "guest" / "boot-s").write_text("47\n")
    (out / "24.11").mkdir()
    (out / "24.11" / "skipped").write_text("no trixie root\n")
    for name, tests, failures, rc in (("26.05", 11, 0, 0), ("26.05-jobid", 11, 2, 1)):
        (out / name).mkdir()
        junit(out / name, tests=tests, failures=failures, skipped=1)
        (out / name / "rc").write_text(f"{rc}\n")
        (out / name / "wall-s").write_text("190\n")
    return out


def test_each_guest_configuration_is_a_row_with_its_own_time(tmp_path: Path) -> None:
    rows = guest_outcomes(CONFIGS, None, guest_out(tmp_path), 1)
    assert [(o.leg.version, o.result, o.counts) for o in rows] == [
        ("24.11", "SKIPPED", None),
        ("26.05", "passed", Counts(10, 0, 1)),
        ("26.05", "FAILED", Counts(8, 2, 1)),
    ]
    assert rows[0].note == "no trixie root"
    assert rows[1].note == "guest booted in 47s"  # the first that ran, and only it
    assert [o.wall_s for o in rows[1:]] == [190.0, 190.0]
    lines = summary(rows, "bookworm").splitlines()
    assert lines[3].split()[:9] == [
        "26.05", "v2", "guest,", "6.12.117", "passed", "10", "0", "1", "3m10s"
    ]  # fmt: skip
    assert lines[3].endswith("SLUID directories; guest booted in 47s")
    assert lines[4].split()[4:9] == ["FAILED", "8", "2", "1", "3m10s"]
    assert exit_status(rows) == 1


def test_a_configuration_the_guest_did_not_finish_failed(tmp_path: Path) -> None:
    out = guest_out(tmp_path)
    (out / "26.05-jobid" / "rc").unlink()
    (out / "26.05-jobid" / "failed").write_text("Slurm's node was not idle within 240 s\n")
    row = guest_outcomes(CONFIGS, None, out, 1)[2]
    assert row.result == "FAILED"
    assert row.note == "Slurm's node was not idle within 240 s; did not finish"


def test_a_guest_that_cannot_be_built_skips_every_configuration(tmp_path: Path) -> None:
    rows = guest_outcomes(CONFIGS, None, tmp_path, GUEST_UNAVAILABLE)
    assert {o.result for o in rows} == {"SKIPPED"}
    assert exit_status(rows) == 0
