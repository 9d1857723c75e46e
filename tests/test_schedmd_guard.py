"""The SchedMD testsuite guard's own logic (tests/schedmd/compare.py, the configurations of
tests/schedmd/guard.py and the deb-src sources of tests/schedmd/source.py): which tests
count as a difference coda makes, what the allowlist excuses, what the matrix prints.
Running the guard is ``tests/schedmd/run-suite``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import matrix
from tests.schedmd import compare, source
from tests.schedmd.compare import (
    FAILED,
    PASSED,
    SKIPPED,
    AllowEntry,
    AllowlistError,
    Counts,
    Difference,
    Summary,
)
from tests.schedmd.guard import (
    ALLOWLIST,
    BY_NAME,
    CONFIGS,
    SKIPLIST,
    atf_test_files,
    pick_configs,
    shard_files,
)
from tests.schedmd.source import WRAPPER, deb_src_sources

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="6">
<testcase classname="tests.commands.srun.test_--mem--mincpus--tmp.Test_mem_mincpus_tmp"
  file="tests/commands/srun/test_--mem--mincpus--tmp.py" line="20" name="test_tmp"/>
<testcase classname="tests.commands.sbatch.test_hetjob"
  file="tests/commands/sbatch/test_hetjob.py" line="16" name="test_hetjob">
  <failure message="assert 1 == 4">AssertionError</failure></testcase>
<testcase classname="tests.parameters.slurm.RoutePlugin.topology.test_plugin"
  file="tests/parameters/slurm/RoutePlugin/topology/test_plugin.py" name="test_route[1]">
  <error message="failed on setup">E</error></testcase>
<testcase classname="tests.commands.sacct.test_--help" file="tests/commands/sacct/test_--help.py"
  name="test_help"><skipped message="needs accounting" type="pytest.skip"/></testcase>
<testcase classname="tests.commands.srun.test_x" file="tests/commands/srun/test_x.py"
  name="test_xfail"><skipped message="known" type="pytest.xfail"/></testcase>
<testcase classname="tests.commands.srun.test_y" file="tests/commands/srun/test_y.py"
  name="test_teardown"/>
<testcase classname="tests.commands.srun.test_y" file="tests/commands/srun/test_y.py"
  name="test_teardown"><error message="failed on teardown">E</error></testcase>
</testsuite></testsuites>
"""


def test_junit_outcomes_by_pytest_id(tmp_path: Path) -> None:
    junit = tmp_path / "atf.xml"
    junit.write_text(JUNIT)
    assert compare.outcomes(junit) == {
        "tests/commands/srun/test_--mem--mincpus--tmp.py::Test_mem_mincpus_tmp::test_tmp": PASSED,
        "tests/commands/sbatch/test_hetjob.py::test_hetjob": FAILED,
        "tests/parameters/slurm/RoutePlugin/topology/test_plugin.py::test_route[1]": FAILED,
        "tests/commands/sacct/test_--help.py::test_help": SKIPPED,
        "tests/commands/srun/test_x.py::test_xfail": SKIPPED,
        # Passed, then its teardown failed: reported twice, the failure wins.
        "tests/commands/srun/test_y.py::test_teardown": FAILED,
    }
    assert compare.failure_messages(junit)["tests/commands/sbatch/test_hetjob.py::test_hetjob"] == (
        "assert 1 == 4"
    )
    assert compare.counts(compare.outcomes(junit)) == Counts(1, 3, 2)


@pytest.mark.parametrize(
    ("baseline", "other", "expected"),
    [
        ({"a": PASSED}, {"a": PASSED}, []),
        ({"a": PASSED}, {"a": FAILED}, ["a"]),
        ({"a": PASSED}, {}, ["a"]),  # the session died before it: a difference
        ({"a": PASSED}, {"a": SKIPPED}, []),  # skipped with coda: nothing to compare
        ({"a": FAILED}, {"a": FAILED}, []),  # fails without coda too
        ({"a": SKIPPED}, {"a": FAILED}, []),
        ({"a": FAILED}, {"a": PASSED}, []),
        ({"b": PASSED, "a": PASSED}, {"a": FAILED, "b": FAILED}, ["a", "b"]),
    ],
)
def test_a_regression_passes_in_the_baseline_and_fails_or_vanishes_with_coda(
    baseline: dict[str, str], other: dict[str, str], expected: list[str]
) -> None:
    assert compare.regressions(baseline, other) == expected


def test_allowlist_lines_name_the_test_the_configurations_and_why() -> None:
    text = (
        "# comment\n\n"
        "tests/a.py::test_a coda-raise-gpu checks CPUs/Task, which raise sets  # why\n"
        "tests/b.py::test_b coda,coda-gpu the partition's DefCpuPerGPU\n"
        "tests/c.py::test_c * every configuration\n"
    )
    entries = compare.parse_allowlist(text, BY_NAME)
    assert entries == [
        AllowEntry(
            "tests/a.py::test_a", ("coda-raise-gpu",), "checks CPUs/Task, which raise sets", 3
        ),
        AllowEntry("tests/b.py::test_b", ("coda", "coda-gpu"), "the partition's DefCpuPerGPU", 4),
        AllowEntry("tests/c.py::test_c", ("*",), "every configuration", 5),
    ]
    assert entries[1].matches("tests/b.py::test_b", "coda-gpu")
    assert not entries[1].matches("tests/b.py::test_b", "coda-raise-gpu")
    assert entries[2].matches("tests/c.py::test_c", "coda")


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("tests/a.py::test_a coda", "want TEST_ID CONFIGS REASON"),
        ("tests/a.py::test_a codaa some reason", "unknown configuration codaa"),
    ],
)
def test_an_allowlist_line_without_a_reason_or_a_known_configuration_is_refused(
    line: str, error: str
) -> None:
    with pytest.raises(AllowlistError, match=error):
        compare.parse_allowlist(line, BY_NAME)


def test_the_shipped_allowlist_and_skip_list_read() -> None:
    compare.parse_allowlist(ALLOWLIST.read_text(), BY_NAME)
    skip = compare.parse_skiplist(SKIPLIST.read_text())
    assert all(f.startswith("tests/") and f.endswith(".py") for f in skip)


def test_a_skipped_file_says_why() -> None:
    assert compare.parse_skiplist("# c\n\ntests/a.py  slow, submits nothing\n") == {
        "tests/a.py": "slow, submits nothing"
    }
    with pytest.raises(AllowlistError, match="want FILE REASON"):
        compare.parse_skiplist("tests/a.py\n")


def test_the_atf_files_less_the_skipped_are_dealt_over_the_clusters(tmp_path: Path) -> None:
    for name in ("tests/test_1.py", "tests/b/test_2.py", "tests/test_3.py", "tests/helper.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    files = atf_test_files(tmp_path, {"tests/test_3.py": "slow"})
    assert files == ["tests/b/test_2.py", "tests/test_1.py"]
    assert shard_files(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert shard_files(["a"], 1) == [["a"]]


def test_an_allowlist_match_excuses_that_failure_only() -> None:
    (entry,) = compare.parse_allowlist(
        'tests/a.py::test_a coda-raise-gpu match="^assert 8 == 4$" raise sets CPUs/Task\n',
        BY_NAME,
    )
    assert (entry.match, entry.reason) == ("^assert 8 == 4$", "raise sets CPUs/Task")
    meant = Difference(
        "tests/a.py::test_a", "coda-raise-gpu", "baseline-gpu", message="assert 8 == 4"
    )
    bug = Difference(
        "tests/a.py::test_a", "coda-raise-gpu", "baseline-gpu", message="assert 1 == 4"
    )
    assert compare.apply_allowlist([meant, bug], [entry]) == []
    assert (meant.verdict, meant.fails_guard) == ("allowed", False)
    assert (bug.verdict, bug.fails_guard) == ("confirmed", True)
    assert "excuses only a failure matching '^assert 8 == 4$'" in bug.reason
    with pytest.raises(AllowlistError, match="line 1: match"):
        compare.parse_allowlist('t coda match="(" why\n', BY_NAME)


def test_the_allowlist_excuses_confirmed_differences_of_its_configurations_only() -> None:
    allow = compare.parse_allowlist(
        "t1 coda-raise-gpu raise sets it\nt2 coda unused entry\nt3 * flaky anyway\n", BY_NAME
    )
    diffs = [
        Difference("t1", "coda-raise-gpu", "baseline-gpu"),
        Difference("t1", "coda-gpu", "baseline-gpu"),
        Difference("t3", "coda", "baseline", verdict="flaky", reason="passed again"),
    ]
    unused = compare.apply_allowlist(diffs, allow)
    assert [(d.verdict, d.reason) for d in diffs] == [
        ("allowed", "raise sets it"),
        ("confirmed", ""),  # not listed for coda-gpu: still fails the guard
        ("flaky", "passed again"),
    ]
    assert [d.fails_guard for d in diffs] == [False, True, False]
    assert [e.test for e in unused] == ["t2"]


def test_every_coda_configuration_has_a_baseline_that_differs_only_by_coda() -> None:
    for c in CONFIGS:
        if c.baseline is not None:
            base = BY_NAME[c.baseline]
            assert c.plugin and not base.plugin and base.baseline is None
            assert c.gpu_env == base.gpu_env


def test_picking_a_configuration_brings_its_baseline() -> None:
    assert [c.name for c in pick_configs("coda-raise-gpu")] == ["baseline-gpu", "coda-raise-gpu"]
    assert [c.name for c in pick_configs(None)] == [c.name for c in CONFIGS]
    with pytest.raises(ValueError, match="unknown configuration nope"):
        pick_configs("coda,nope")


def test_the_summary_line_gives_each_configuration_and_names_what_fails(tmp_path: Path) -> None:
    summary = Summary(
        "22.05.8",
        "FAILED",
        configs={"baseline": {"passed": 60, "failed": 8, "skipped": 174}},
        differences=[
            Difference("tests/a.py::test_a", "coda-raise-gpu", "baseline-gpu"),
            Difference("tests/b.py::test_b", "coda", "baseline", verdict="flaky"),
        ],
    )
    summary.write(tmp_path)
    again = compare.load_summary(tmp_path / compare.SUMMARY_FILE)
    assert again == summary
    assert compare.one_line(again) == (
        "FAILED: baseline 60/8/174; 1 differences (0 allowed, 1 flaky): "
        "tests/a.py::test_a [coda-raise-gpu]"
    )
    skipped = Summary("26.05.5", "SKIPPED", "no testsuite/python")
    assert compare.one_line(skipped) == "SKIPPED: no testsuite/python"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "sources.list",
            "deb http://deb.debian.org/debian sid main\n# deb http://x y z\n",
            "deb-src http://deb.debian.org/debian sid main\n# deb http://x y z\n",
        ),
        (
            "debian.sources",
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n",
            "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n",
        ),
        ("debian.sources", "Types: deb-src\nURIs: http://x\n", None),
        ("empty.list", "# nothing\n", None),
    ],
)
def test_the_systems_mirrors_are_read_as_source_mirrors(
    name: str, text: str, expected: str | None
) -> None:
    assert deb_src_sources(name, text) == expected


def test_the_matrix_prints_each_guard_after_its_table_and_a_failed_guard_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Summary(
        "22.05.8",
        "FAILED",
        wall_s=130.0,
        configs={"baseline": {"passed": 60, "failed": 16, "skipped": 166}},
        differences=[Difference("tests/a.py::test_a", "coda", "baseline")],
    ).write(tmp_path)
    guard = matrix.read_guard(tmp_path, 1)
    assert guard == matrix.Guard(
        "FAILED", "baseline 60/16/166; 1 differences: tests/a.py::test_a [coda]", 130.0
    )
    host = matrix.Leg("22.05", None, None, "tests that need no Slurm, in .venv")
    root = matrix.Leg("26.05", "sid", None, "packages")
    outcomes = [
        matrix.Outcome(host, "passed", matrix.Counts(10, 0, 1), 60.0, guard=guard),
        matrix.Outcome(
            root,
            "passed",
            matrix.Counts(5, 0, 0),
            600.0,
            guard=matrix.read_guard(tmp_path / "none", 0),
        ),
    ]
    lines = matrix.summary(outcomes, "bookworm").splitlines()
    assert lines[-4:] == [
        "SchedMD testsuite guard (tests/schedmd/run-suite), passed/failed/skipped:",
        "  22.05  host (bookworm)  FAILED  2m10s  baseline 60/16/166; 1 differences: "
        "tests/a.py::test_a [coda]",
        "  26.05  sid root  FAILED  0s  no summary.json (exit 0)",
        "15 passed, 0 failed, 1 skipped",  # the guard's counts are not the legs'
    ]
    assert matrix.exit_status(outcomes) == 1
    skipped = matrix.Guard("SKIPPED", "no testsuite/python in Debian's source", 1.0)
    assert matrix.exit_status([matrix.Outcome(host, "passed", None, 1.0, guard=skipped)]) == 0


@pytest.mark.parametrize(
    ("env", "args", "marker", "expected"),
    [
        (None, [], None, True),
        (None, ["tests/controller/test_hook.py"], None, False),
        (None, [], "slurm", False),
        ("1", ["tests/controller/test_hook.py"], None, True),
        ("0", [], None, False),
    ],
)
def test_the_guard_runs_on_a_full_run_unless_told(
    monkeypatch: pytest.MonkeyPatch,
    env: str | None,
    args: list[str],
    marker: str | None,
    expected: bool,
) -> None:
    if env is None:
        monkeypatch.delenv(matrix.GUARD_ENV, raising=False)
    else:
        monkeypatch.setenv(matrix.GUARD_ENV, env)
    assert matrix.wants_schedmd_guard(args, marker) is expected


def test_the_prefix_wrapper_answers_versions_as_schedmd_builds_and_passes_the_rest(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real-squeue"
    real.write_text(
        '#!/bin/sh\nif [ "$1" = -V ]; then echo "slurm-wlm 26.05.5"; else echo "$0 $*"; fi\n'
    )
    real.chmod(0o755)
    wrapper = tmp_path / "bin" / "squeue"
    wrapper.parent.mkdir()
    wrapper.write_text(WRAPPER.format(real=real))
    wrapper.chmod(0o755)

    def run(*args: str) -> str:
        argv = [str(wrapper), *args]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    assert run("-V") == "slurm 26.05.5\n"
    # Anything else runs the real program; a shell script's $0 is its own path, so this
    # shows the arguments pass through unchanged.
    assert run("--json", "-u", "root").endswith("--json -u root\n")


def test_a_version_whose_source_is_not_served_runs_the_served_testsuite(tmp_path: Path) -> None:
    """24.11's source is listed but not served: the cache's bookworm ATF runs instead, and
    the origin says both which ran and why; the version's own is not asked for again."""
    served = tmp_path / "22.05.8"
    (served / source.SOURCE / source.ATF).mkdir(parents=True)
    (served / source.SOURCE / source.ATF / "conftest.py").write_text("")
    (served / source.ORIGIN).write_text("Debian slurm-wlm=22.05.8-4+deb12u3 (bookworm)\n")
    (served / source.SERVED_MARK).write_text("bookworm\n")
    (tmp_path / f"24.11.5{source.UNSERVED_SUFFIX}").write_text("apt-get source: 404 Not Found\n")
    installed = source.Installed("24.11.5", "slurm-wlm", "24.11.5-4+deb13u1")
    suite = source.ensure(installed, cache_dir=tmp_path)
    assert suite.source_dir == served / source.SOURCE
    assert suite.origin.startswith("Debian slurm-wlm=22.05.8-4+deb12u3 (bookworm);")
    assert "Slurm 24.11.5's own testsuite: apt-get source: 404 Not Found" in suite.origin


def test_the_mirror_of_the_systems_sources(tmp_path: Path) -> None:
    state = tmp_path / "apt"
    (state / "sources.list.d").mkdir(parents=True)
    (state / "sources.list").write_text("")
    (state / "sources.list.d" / "debian.sources").write_text(
        "Types: deb-src\nURIs: http://security.debian.org/debian-security\n\n"
        "Types: deb-src\nURIs: http://mirror.example/debian\nSuites: trixie\n"
    )
    assert source._mirror_uri(state) == "http://mirror.example/debian"
    (state / "sources.list").write_text("deb-src [arch=amd64] http://m2.example/debian sid main\n")
    assert source._mirror_uri(state) == "http://m2.example/debian"
