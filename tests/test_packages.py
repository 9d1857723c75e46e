"""coda's Debian packages as an admin meets them: what apt does when Slurm moves on, what a
removal refuses, and what upgrading or removing coda-node does to the jobs it slimmed.

These run where tests/package-leg installed the packages (each version root of the matrix:
``CODA_TEST_DEBS`` names the folder of the .debs it built); elsewhere they skip. They change
the installed system (remove, reinstall), and leave the packages installed as they found
them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_plugin.devtools.cluster import DevCluster
from slurm_plugin.hook.guard import SlurmVersion, format_version, parse_slurmctld_version
from tests.conftest import require_slurm, started
from tests.node.test_node_slurm import _cgroup_v1_reason as cgroup_v1_reason
from tests.node.test_node_slurm import _start as start_confined_job

pytestmark = [pytest.mark.slurm, pytest.mark.package]

DEBS = Path(os.environ.get("CODA_TEST_DEBS", "/nonexistent"))
PLUGIN_PACKAGE = "coda-slurm-plugin"
GUARD_DROP_IN = Path("/usr/lib/systemd/system/slurmctld.service.d/coda-plugin-guard.conf")
SLEEP = "#!/bin/bash\nsleep 600\n"


def _installed(package: str) -> bool:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return out.stdout.endswith(" installed")


def _require_packages() -> None:
    if not DEBS.is_dir() or not _installed("coda-slurm"):
        pytest.skip("needs coda's Debian packages installed (tests/package-leg in a version root)")


@pytest.fixture(autouse=True)
def _packages() -> None:
    _require_packages()


def _apt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "-y", "-q", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**(env or os.environ), "DEBIAN_FRONTEND": "noninteractive"},
    )


def _reinstall(*packages: str) -> None:
    """Put packages back from the leg's .debs (a test that removed them)."""
    files = [str(next(DEBS.glob(f"{p}_*.deb"))) for p in packages]
    out = _apt("install", "--reinstall", "--no-install-recommends", *files)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def _slurm_release() -> SlurmVersion:
    out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=True)
    return parse_slurmctld_version(out.stdout)


def test_the_plugin_package_pins_the_slurm_and_the_python_it_was_built_for() -> None:
    depends = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}", PLUGIN_PACKAGE], capture_output=True, text=True
    ).stdout
    release = _slurm_release()
    nxt = (release[0], release[1], release[2] + 1)
    assert f"slurmctld (>= {format_version(release)})" in depends, depends
    assert f"slurmctld (<< {format_version(nxt)}~)" in depends, depends
    python = f"libpython{sys.version_info.major}.{sys.version_info.minor}"
    assert python in depends, depends
    plugin_files = subprocess.run(["dpkg", "-L", PLUGIN_PACKAGE], capture_output=True, text=True)
    assert re.search(r"/slurm-wlm/job_submit_coda\.so$", plugin_files.stdout, re.M)
    assert "ExecStartPre=-/usr/bin/coda-slurm plugin guard" in GUARD_DROP_IN.read_text()


def _fake_slurmctld(repo: Path, version: str) -> None:
    """A package that says it is slurmctld ``version``: all apt needs to plan an upgrade."""
    pkg = repo / "build"
    (pkg / "DEBIAN").mkdir(parents=True)
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: slurmctld\nVersion: {version}\nArchitecture: {arch}\n"
        "Maintainer: coda tests <root@localhost>\nDescription: a newer Slurm, for apt's plan\n"
    )
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(repo / "slurmctld.deb")],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(pkg)
    packages = subprocess.run(
        ["dpkg-scanpackages", "."], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    (repo / "Packages").write_text(packages)


def test_apt_keeps_a_newer_slurm_back_and_upgrades_it_only_by_removing_the_plugin(
    tmp_path: Path,
) -> None:
    """The dependency does its work: ``apt upgrade`` leaves Slurm where the plugin works;
    upgrading Slurm by name takes the plugin package out, and never installs a plugin
    that does not match (the guard then rebuilds one, tests/controller/test_plugin_guard.py)."""
    release = _slurm_release()
    newer = f"{format_version((release[0], release[1], release[2] + 1))}-1"
    repo = tmp_path / "repo"
    repo.mkdir()
    _fake_slurmctld(repo, newer)
    (tmp_path / "lists" / "partial").mkdir(parents=True)
    sources = tmp_path / "sources.list"
    sources.write_text(f"deb [trusted=yes] file:{repo} ./\n")
    only_ours = [
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::State::Lists={tmp_path / 'lists'}",
        "-oDir::Cache::pkgcache=",
        "-oDir::Cache::srcpkgcache=",
    ]
    assert _apt(*only_ours, "update").returncode == 0
    upgrade = _apt(*only_ours, "-s", "upgrade")
    assert upgrade.returncode == 0, upgrade.stderr
    assert re.search(r"kept back:\s*\n\s*slurmctld", upgrade.stdout), upgrade.stdout
    assert "Inst slurmctld" not in upgrade.stdout
    by_name = _apt(*only_ours, "-s", "install", "slurmctld")
    assert by_name.returncode == 0, by_name.stderr
    assert re.search(rf"REMOVED:\s*\n\s*{PLUGIN_PACKAGE}\b", by_name.stdout), by_name.stdout
    assert f"Remv {PLUGIN_PACKAGE}" in by_name.stdout
    assert f"Inst slurmctld [{format_version(release)}" in by_name.stdout


def test_removing_the_controller_package_while_slurm_conf_names_coda_is_refused(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nJobSubmitPlugins=lua,coda\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    refused = _apt("remove", "coda-slurm", env=env)
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "JobSubmitPlugins" in said and str(conf) in said, said
    assert _installed("coda-slurm") and _installed(PLUGIN_PACKAGE)
    # With coda out of JobSubmitPlugins, the removal goes through; then reinstall.
    conf.write_text("ClusterName=x\nJobSubmitPlugins=lua\n")
    try:
        removed = _apt("remove", "coda-slurm", env=env)
        assert removed.returncode == 0, removed.stdout[-2000:] + removed.stderr[-2000:]
        assert not _installed("coda-slurm") and not _installed(PLUGIN_PACKAGE)
    finally:
        _reinstall("coda-slurm", PLUGIN_PACKAGE)


# -- coda-node: an upgrade or a removal puts slimmed jobs back first ------------------------


@pytest.fixture(scope="module")
def cg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    _require_packages()
    require_slurm()
    reason = cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    yield from started(DevCluster(tmp_path_factory.mktemp("pkgslurm"), cgroups=True))


def _slimmed_job(c: DevCluster) -> tuple[int, Path]:
    """A GPU job that the installed coda-node slimmed to one core and then died: SIGKILL,
    so nothing it did was undone."""
    job_id, job_dir, _ = start_confined_job(c, ["--gpus=1", "-c2"], SLEEP)
    cpus = job_dir / "cpuset.cpus"
    assert cpus.read_text().strip() == "0-1"
    node = ["/usr/bin/coda-node"]
    conf = ["--conf", str(c.coda_conf)]
    limited = subprocess.run(
        [*node, "limit", str(job_id), "--cores", "1", *conf],
        capture_output=True,
        text=True,
        timeout=60,
        env=c.env,
    )
    assert limited.returncode == 0, limited.stderr
    daemon = subprocess.Popen(
        [*node, "run", *conf], env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while cpus.read_text().strip() != "0":
            assert time.monotonic() < deadline, "the installed coda-node did not slim the job"
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
    assert cpus.read_text().strip() == "0"
    return job_id, cpus


@pytest.mark.parametrize("how", ["upgrade", "remove"])
def test_upgrading_or_removing_coda_node_puts_slimmed_jobs_back_first(
    cg_cluster: DevCluster, how: str
) -> None:
    """The node package's prerm runs ``coda-node restore`` (with the coda.conf the admin's
    environment names, as for any coda-node command) before the daemon's code goes."""
    job_id, cpus = _slimmed_job(cg_cluster)
    env = {**cg_cluster.env, "CODA_CONF": str(cg_cluster.coda_conf)}
    try:
        if how == "upgrade":
            out = _apt("install", "--reinstall", str(next(DEBS.glob("coda-node_*.deb"))), env=env)
        else:
            out = _apt("remove", "coda-node", env=env)
        said = out.stdout[-3000:] + out.stderr[-3000:]
        assert out.returncode == 0, said
        assert cpus.read_text().strip() == "0-1", f"job {job_id} left slimmed by the {how}:\n{said}"
        assert f"({job_id})" in out.stdout + out.stderr
    finally:
        cg_cluster.run(["scancel", str(job_id)], check=False)
        if not _installed("coda-node"):
            _reinstall("coda-node")
