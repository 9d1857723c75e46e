"""SchedMD's own testsuite as a guard: Slurm's Python ATF must come out the same with
job_submit/coda loaded as without it.

    tests/schedmd/run-suite [--out DIR] [--configs NAME,...] [--source PATH] [TEST ...]

Each configuration (CONFIGS) is its own dev cluster (slurm_plugin.devtools.cluster with
accounting, started once; the plugin is the one DevCluster installs: the checkout's build
in .venv, the Debian package's in a version root), or several when the testsuite is large
(--shards: its test files dealt round-robin), and the ATF runs against each in local-config
mode, all at once (its tests mostly wait on Slurm, not on the CPU), with the plugin
tests/schedmd/atf/coda_schedmd_cleanup.py emptying the queue after each file.  Files listed
in tests/schedmd/skip (each with why) are left out.  A test that passes in a
configuration's baseline and fails (or is never reported) with coda is run again alone, with
coda and without, up to CONFIRM_RUNS times; it fails the guard when it fails with coda and
passes without it every time, unless tests/schedmd/allowlist excuses it for that
configuration with a reason.  The slurmctld lines with ``coda:`` logged while it ran alone
are printed with it.

Writes into --out: summary.json (what tests/matrix.py prints), each session's junit report,
ATF log and slurmctld log.  Exit status: 0 same outcomes, 1 a difference (or a cluster that
would not start), 2 a bad argument, allowlist or skip list, 3 the testsuite cannot be had
here (source.Unavailable: no mirror, or no ATF in that Slurm's release).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_plugin.devtools.accounting import AccountingError
from slurm_plugin.devtools.cluster import DevCluster, DevClusterError
from tests.schedmd import compare, source
from tests.schedmd.compare import Difference, Summary

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "allowlist"
SKIPLIST = HERE / "skip"
CLEANUP_PLUGIN = "coda_schedmd_cleanup"
"""tests/schedmd/atf/coda_schedmd_cleanup.py: empties the queue after each ATF test file."""
GPU_ENV = {"SBATCH_GPUS_PER_NODE": "1", "SALLOC_GPUS_PER_NODE": "1", "SLURM_GPUS_PER_NODE": "1"}
"""Every job the ATF submits (sbatch, salloc, srun) asks for one GPU per node."""
RAISE_CONF = "DefaultCpusPerGpu=share\nUnprofiledUserValue=raise\n"
"""coda.conf that makes coda rewrite every GPU job: no workload has a profile on a fresh
cluster, so each gets the node's cores per GPU, a user's lower request raised to it."""
PASS_TIMEOUT_S = 1200.0
"""One ATF session: Slurm 22.05's 102 files take about 90 s."""
FILES_PER_SHARD = 150
"""The default --shards: one cluster per configuration for every this many test files."""
RERUN_TIMEOUT_S = 300.0
CONFIRM_RUNS = 3
"""How often a difference is run again alone, with coda and without, before it counts: the
ATF has tests that race Slurm (signals sent before the step starts, tasks killed within a
second), which a loaded machine loses now and then with or without coda."""
ATF_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""The ATF's PATH (after the prefix's bin and sbin): Debian's Slurm commands and python3,
nothing of a virtualenv."""
CALLER_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "CODA_")
"""The caller's variables the ATF must not inherit (CI may itself run inside a Slurm job)."""


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    plugin: bool
    """job_submit/coda loaded (JobSubmitPlugins=coda); otherwise no job-submit plugin."""
    gpu_env: bool
    baseline: str | None
    """The configuration it is compared with; None for a baseline."""
    what: str
    coda_conf: str = ""


CONFIGS = (
    Config("baseline", False, False, None, "no job-submit plugin"),
    Config("coda", True, False, "baseline", "job_submit/coda as shipped"),
    Config("baseline-gpu", False, True, None, "no job-submit plugin, every job asks for a GPU"),
    Config("coda-gpu", True, True, "baseline-gpu", "coda as shipped, every job asks for a GPU"),
    Config(
        "coda-raise-gpu",
        True,
        True,
        "baseline-gpu",
        "coda with DefaultCpusPerGpu=share and UnprofiledUserValue=raise (every GPU job is "
        "rewritten), every job asks for a GPU",
        RAISE_CONF,
    ),
)
BY_NAME = {c.name: c for c in CONFIGS}


@dataclass(slots=True)
class Pass:
    """One ATF session: a configuration's cluster and the test files it runs."""

    config: Config
    cluster: DevCluster
    dir: Path
    """Its folder of the report (testsuite.conf, junit, ATF log, slurmctld log)."""
    files: list[str]
    results: dict[str, str]
    wall_s: float = 0.0


def say(text: str) -> None:
    print(f"schedmd-guard: {text}", flush=True)


def pick_configs(names: str | None) -> list[Config]:
    """The configurations asked for, each with its baseline."""
    if not names:
        return list(CONFIGS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown configuration {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    for n in list(wanted):
        base = BY_NAME[n].baseline
        if base and base not in wanted:
            wanted.append(base)
    return [c for c in CONFIGS if c.name in wanted]


def atf_env(
    cluster: DevCluster, config: Config, testsuite_conf: Path, prefix: Path
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CALLER_ENV_PREFIXES)}
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(k, None)
    env.update(
        PATH=f"{prefix / 'bin'}:{prefix / 'sbin'}:{ATF_PATH}",
        PYTHONPATH=":".join(
            [str(HERE / "atf"), *([str(HERE / "atf-compat")] if source.py_io_missing() else [])]
        ),
        SLURM_CONF=str(cluster.slurm_conf),
        SLURM_TESTSUITE_CONF=str(testsuite_conf),
    )
    if config.gpu_env:
        env.update(GPU_ENV)
    return env


def write_testsuite_conf(
    path: Path, suite: source.Testsuite, cluster: DevCluster, prefix: Path
) -> None:
    """The ATF's testsuite.conf: Slurm under ``prefix`` (source.make_prefix), the dev
    cluster's config dir."""
    path.write_text(
        f"SlurmSourceDir = {suite.source_dir}\nSlurmBuildDir = {suite.source_dir}\n"
        f"SlurmInstallDir = {prefix}\nSlurmConfigDir = {cluster.etc}\n"
    )


def shard_files(files: Sequence[str], shards: int) -> list[list[str]]:
    """``files`` dealt round-robin into ``shards`` lists (neighbours, often alike in cost,
    land on different clusters)."""
    return [list(files[k::shards]) for k in range(shards)]


class Sessions:
    """The ATF sessions running now, so that an interrupted guard stops them (each runs in
    its own process group: its sruns and pexpect children go with it)."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], timeout_s: float, **kwargs: Any) -> bool:
        """Run to the end; False when it ran past ``timeout_s`` and was killed."""
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        with self._lock:
            self._procs.add(proc)
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self._kill(proc)
            return False
        finally:
            with self._lock:
                self._procs.discard(proc)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            self._kill(proc)

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


SESSIONS = Sessions()


@dataclass(frozen=True, slots=True)
class Atf:
    """What every ATF session runs with."""

    python: Path
    suite: source.Testsuite
    prefix: Path
    options: tuple[str, ...] = ()
    """The ATF's own options (atf_options)."""


ALLOW_DB_MODIFY = "--allow-slurmdbd-modify"
"""The ATF's leave to change the accounting database in local-config mode (SchedMD's master;
each dev cluster's MariaDB is its own and thrown away): the tests of hetjobs, accounts and
QOS run instead of skipping."""


def atf_options(atf_dir: Path) -> tuple[str, ...]:
    conftest = (atf_dir / "conftest.py").read_text(errors="replace")
    return (ALLOW_DB_MODIFY,) if ALLOW_DB_MODIFY in conftest else ()


def run_atf(
    atf: Atf, p: Pass, tests: Sequence[str], tag: str, timeout_s: float
) -> tuple[dict[str, str], dict[str, str]]:
    """One pytest session of the ATF against ``p``'s cluster: (outcomes, failure messages)."""
    junit = p.dir / f"{tag}.xml"
    args = [
        str(atf.python),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        CLEANUP_PLUGIN,
        "--continue-on-collection-errors",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
        f"--basetemp={p.cluster.root.parent / ('atf-' + tag)}",
        "-q",
        "-rfE",
        *atf.options,
        *tests,
    ]
    with open(p.dir / f"{tag}.log", "wb") as log:
        finished = SESSIONS.run(
            args,
            timeout_s,
            cwd=atf.suite.atf_dir,
            env=atf_env(p.cluster, p.config, p.dir / "testsuite.conf", atf.prefix),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not finished:
            log.write(
                f"\nschedmd-guard: the ATF ran past {timeout_s:g} s and was killed\n".encode()
            )
    if not junit.exists():
        return {}, {}
    return compare.outcomes(junit), compare.failure_messages(junit)


def coda_lines(log: Path, offset: int) -> list[str]:
    """slurmctld's lines with ``coda:`` written after ``offset``."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            return [ln.rstrip("\n") for ln in f if "coda:" in ln]
    except OSError:
        return []


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def confirm(d: Difference, coda: Pass, base: Pass, atf: Atf, n: int) -> None:
    """Run the test alone again, with coda then without, up to CONFIRM_RUNS times, and set
    ``d``'s verdict: confirmed when it fails with coda and passes without it every time; a
    test that passes with coda once, or fails without it once, is flaky, not a difference
    coda makes."""
    for attempt in range(1, CONFIRM_RUNS + 1):
        offset = log_size(coda.cluster.ctld_log)
        tag = f"rerun-{n}-{attempt}"
        again, messages = run_atf(atf, coda, [d.test], tag, RERUN_TIMEOUT_S)
        d.coda_log = coda_lines(coda.cluster.ctld_log, offset)
        d.message = messages.get(d.test, d.message)
        if again.get(d.test) == compare.PASSED:
            d.verdict = "flaky"
            d.reason = f"passed with coda when run again alone (run {attempt})"
            return
        base_again, _ = run_atf(atf, base, [d.test], tag, RERUN_TIMEOUT_S)
        if base_again.get(d.test) != compare.PASSED:
            outcome = base_again.get(d.test, "not run")
            d.verdict = "flaky"
            d.reason = f"{outcome} in {base.config.name} when run again alone (run {attempt})"
            return


def report(summary: Summary) -> None:
    rows = [("configuration", "passed", "failed", "skipped", "time", "compared with")]
    for name, c in summary.configs.items():
        rows.append(
            (
                name,
                str(c["passed"]),
                str(c["failed"]),
                str(c["skipped"]),
                f"{float(c['wall_s']):.0f}s",
                str(c["baseline"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        cells = [r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in range(1, 5)), r[5]]
        print("  " + "  ".join(cells).rstrip())
    if summary.differences:
        print("Tests that passed in the baseline and failed with coda:")
    for d in summary.differences:
        why = f": {d.reason}" if d.reason else ""
        print(f"  {d.test}  [{d.config} vs {d.baseline}]  {d.verdict}{why}")
        if d.message:
            print(f"      {d.message.splitlines()[0][:300]}")
        for line in d.coda_log[-6:]:
            print(f"      {line}")
    for entry in summary.unused_allowlist:
        print(f"  allowlist entry excused nothing this run: {entry}")


def atf_test_files(atf_dir: Path, skip: Mapping[str, str]) -> list[str]:
    """The ATF's test files (``tests/...``, as pytest names them), less the skip list."""
    found = sorted(str(f.relative_to(atf_dir)) for f in (atf_dir / "tests").rglob("test_*.py"))
    return [f for f in found if f not in skip]


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        configs = pick_configs(args.configs)
        allow = compare.parse_allowlist(args.allowlist.read_text(), BY_NAME)
        skip = compare.parse_skiplist(SKIPLIST.read_text())
    except (ValueError, OSError) as exc:
        say(f"error: {exc}")
        return 2
    slurm = "?"
    try:
        installed = source.installed_slurm()
        slurm = installed.version
        suite = source.ensure(installed, args.source)
        python = source.ensure_atf_python()
        if source.atf_needs_sudo(suite.atf_dir):
            source.ensure_sudo()
    except source.Unavailable as exc:
        say(f"SKIPPED: Slurm {slurm}: {exc}")
        Summary(slurm, "SKIPPED", str(exc), wall_s=time.monotonic() - start).write(out)
        return 3
    say(f"Slurm {slurm}; SchedMD's testsuite from {suite.origin} ({suite.atf_dir})")
    if args.fetch_only:
        return 0
    summary = Summary(slurm, "passed", testsuite=suite.origin)
    work = Path(tempfile.mkdtemp(prefix="coda-schedmd-", dir="/tmp"))
    atf = Atf(python, suite, source.make_prefix(work / "prefix"), atf_options(suite.atf_dir))
    if args.tests:
        shards = [list(args.tests)]
    else:
        files = atf_test_files(suite.atf_dir, skip)
        left_out = len([f for f in skip if (suite.atf_dir / f).is_file()])
        count = args.shards or max(1, -(-len(files) // FILES_PER_SHARD))
        shards = shard_files(files, count)
        say(
            f"{len(files)} test files ({left_out} more left out, tests/schedmd/skip), "
            f"{count} cluster(s) per configuration"
        )
    passes: dict[str, list[Pass]] = {c.name: [] for c in configs}
    try:
        for c in configs:
            for k, files in enumerate(shards, 1):
                name = c.name if len(shards) == 1 else f"{c.name}.{k}"
                cluster = DevCluster(
                    work / name / "cluster",
                    job_submit_plugins="coda" if c.plugin else "",
                    coda_conf_extra=c.coda_conf,
                    accounting=True,
                )
                p = Pass(c, cluster, out / name, files, {})
                p.dir.mkdir(parents=True, exist_ok=True)
                passes[c.name].append(p)
                cluster.up()
                write_testsuite_conf(p.dir / "testsuite.conf", suite, cluster, atf.prefix)
        every = [p for ps in passes.values() for p in ps]
        say(
            f"{len(every)} dev clusters up in {time.monotonic() - start:.0f}s; the ATF "
            f"(local-config) runs against each: {', '.join(p.dir.name for p in every)}"
        )
        for c in configs:
            print(f"  {c.name}: {c.what}", flush=True)

        def one(p: Pass) -> None:
            t0 = time.monotonic()
            p.results, _ = run_atf(atf, p, p.files, "atf", PASS_TIMEOUT_S)
            p.wall_s = time.monotonic() - t0

        pool = ThreadPoolExecutor(max_workers=args.jobs or len(every))
        try:
            for future in [pool.submit(one, p) for p in every]:
                future.result()
        finally:
            SESSIONS.stop_all()  # on an interruption: the other passes end now
            pool.shutdown()
        merged = {name: merge(ps) for name, ps in passes.items()}
        n = 0
        for c in configs:
            if c.baseline is None:
                continue
            for test in compare.regressions(merged[c.baseline], merged[c.name]):
                n += 1
                d = Difference(test, c.name, c.baseline)
                confirm(d, owner(passes[c.name], test), owner(passes[c.baseline], test), atf, n)
                summary.differences.append(d)
        unused = compare.apply_allowlist(summary.differences, allow)
        ran = set(passes)
        summary.unused_allowlist = [
            f"line {e.line}: {e.test} {','.join(e.configs)}"
            for e in unused
            if (compare.ALLOW_ALL in e.configs or ran & set(e.configs))
            and (suite.atf_dir / e.test.partition("::")[0]).is_file()
        ]
    except (DevClusterError, AccountingError, OSError, subprocess.SubprocessError) as exc:
        summary.status, summary.reason = "FAILED", f"the dev cluster: {exc}"
    finally:
        SESSIONS.stop_all()
        for p in (p for ps in passes.values() for p in ps):
            try:
                p.cluster.down()
            except (DevClusterError, AccountingError, OSError, subprocess.SubprocessError) as exc:
                say(f"stopping {p.dir.name}'s cluster: {exc}")
            if p.cluster.ctld_log.exists():
                shutil.copy(p.cluster.ctld_log, p.dir / "slurmctld.log")
        shutil.rmtree(work, ignore_errors=True)
    summary.wall_s = time.monotonic() - start
    for c in configs:
        counts = compare.counts(merge(passes[c.name]))
        summary.configs[c.name] = {
            "passed": counts.passed,
            "failed": counts.failed,
            "skipped": counts.skipped,
            "wall_s": round(max((p.wall_s for p in passes[c.name]), default=0.0), 1),
            "baseline": c.baseline or "",
        }
    if summary.status == "passed" and any(not p.results for ps in passes.values() for p in ps):
        summary.status, summary.reason = "FAILED", "an ATF session reported no tests"
    if any(d.fails_guard for d in summary.differences):
        summary.status = "FAILED"
    report(summary)
    summary.write(out)
    say(f"{summary.status} in {summary.wall_s:.0f}s: {compare.details(summary)}")
    say(f"reports in {out}")
    return 0 if summary.status == "passed" else 1


def merge(passes: Sequence[Pass]) -> dict[str, str]:
    """A configuration's outcomes over its clusters."""
    return {t: o for p in passes for t, o in p.results.items()}


def owner(passes: Sequence[Pass], test: str) -> Pass:
    """The session of a configuration that ran ``test`` (its file), for running it again."""
    file = test.partition("::")[0]
    return next((p for p in passes if file in p.files), passes[0])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tests/schedmd/run-suite",
        description="Run SchedMD's Python testsuite (local-config) against dev clusters "
        "with and without job_submit/coda and compare the outcomes.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report folder (default: a new /tmp/coda-schedmd-report-* folder)",
    )
    parser.add_argument(
        "--configs",
        help="comma-separated configurations, each run with its baseline (default: all: "
        f"{', '.join(BY_NAME)})",
    )
    parser.add_argument(
        "--source",
        type=Path,
        help="a Slurm source tree or tarball holding testsuite/python, cached for the "
        "installed version instead of Debian's source package",
    )
    parser.add_argument(
        "--fetch-only", action="store_true", help="fetch and cache the testsuite, run nothing"
    )
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    parser.add_argument(
        "--jobs", type=int, default=0, help="ATF sessions at once (default: all of them)"
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help=f"clusters per configuration, each running a share of the test files "
        f"(default: one per {FILES_PER_SHARD} files)",
    )
    parser.add_argument("tests", nargs="*", help="ATF test files or ids (default: all, tests/)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="coda-schedmd-report-"))
    return args


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    # A TERM (the matrix or tests/slurm-root giving up) stops the clusters as ^C does.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return run(parse_args(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
