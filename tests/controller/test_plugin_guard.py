"""``coda-slurm plugin guard``: no Slurm or Python upgrade stops slurmctld because of coda.

slurmctld exits on a job_submit plugin built for another Slurm release (micro included).
The guard, run just before slurmctld starts, rebuilds job_submit_coda.so when it can and
installs the passthrough (every job unchanged) when it cannot.  The pure parts are table
tests; the guard runs against a stand-in ``slurmctld -V``; the last test upgrades a real
slurmctld by a micro release and starts it with and without the guard.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from coda_common.slurm.slurmconf import read_slurm_keys
from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.cli.main import cli as coda_slurm
from slurm_plugin.devtools.cluster import DevCluster, DevClusterError
from slurm_plugin.hook import elf
from slurm_plugin.hook.guard import (
    format_version,
    guard,
    header_version,
    names_coda,
    package_name,
    parse_slurmctld_version,
    rpm_family,
    version_number,
    version_of_number,
)
from slurm_plugin.hook.install import (
    PLUGIN_FILE,
    PluginNotBuilt,
    built_plugin,
    find_system_plugin_dir,
)
from tests.conftest import gres, require_slurm

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "csrc" / "build_plugin.py"
LIBPYTHON = sysconfig.get_config_var("INSTSONAME")


# -- pure parts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("printed", "version"),
    [
        ("slurm-wlm 22.05.8\n", (22, 5, 8)),
        ("slurm 24.11.5\n", (24, 11, 5)),
        ("slurm 23.02.0-0rc1\n", (23, 2, 0)),
        ("slurm 26.05.1", (26, 5, 1)),
    ],
)
def test_the_version_slurmctld_prints_is_read(printed: str, version: tuple) -> None:
    assert parse_slurmctld_version(printed) == version


@pytest.mark.parametrize("printed", ["", "slurmctld: invalid option -- 'V'", "slurm 22.05"])
def test_no_version_is_an_error_not_a_guess(printed: str) -> None:
    with pytest.raises(ValueError):
        parse_slurmctld_version(printed)


@pytest.mark.parametrize(
    ("version", "number"),
    [((22, 5, 8), 0x160508), ((24, 11, 5), 0x180B05), ((26, 5, 0), 0x1A0500)],
)
def test_slurm_version_number(version: tuple, number: int) -> None:
    assert version_number(version) == number
    assert version_of_number(number) == version


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("lua,coda", True),
        ("job_submit/coda", True),
        (" lua , job_submit/coda ", True),
        ("coda", True),
        ("lua", False),
        ("coda_extra,require_timelimit", False),
        ("", False),
        (None, False),
    ],
)
def test_job_submit_plugins_naming_coda(value: str | None, named: bool) -> None:
    assert names_coda(value) is named


def test_slurm_conf_keys_follow_includes_and_skip_node_lines(tmp_path: Path) -> None:
    (tmp_path / "plugins.conf").write_text("JobSubmitPlugins=lua,coda\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=c  # a comment\n"
        "jobsubmitplugins=lua\n"
        "Include plugins.conf\n"
        "PluginDir=/opt/a:/opt/b\n"
        "NodeName=n1 CPUs=4 PluginDir=not-a-key-here\n"
    )
    keys = read_slurm_keys(conf, ("JobSubmitPlugins", "PluginDir"))
    assert keys == {"jobsubmitplugins": "lua,coda", "plugindir": "/opt/a:/opt/b"}
    conf.write_text("ClusterName=c\n")
    assert read_slurm_keys(conf, ("JobSubmitPlugins",)) == {}


def test_header_version_is_the_first_dir_that_has_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    headers = fake_headers(tmp_path / "inc", (24, 11, 5))
    assert header_version((empty, headers)) == (headers, (24, 11, 5))
    assert header_version((empty,)) is None


# -- the ELF reader --------------------------------------------------------------------


def real_plugin() -> Path:
    try:
        return built_plugin()
    except PluginNotBuilt as exc:
        pytest.skip(str(exc))


def test_the_real_plugin_says_the_slurm_and_python_it_was_built_for() -> None:
    path = real_plugin()
    data = path.read_bytes()
    so = elf.parse(data)
    found = header_version((Path("/usr/include"), Path("/usr/local/include")))
    if found is None:
        pytest.skip("Slurm's headers (libslurm-dev) are not installed")
    assert so.u32(data, "plugin_version") == version_number(found[1])
    assert LIBPYTHON in so.needed
    assert "coda_passthrough" not in so.symbols


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not an ELF file"),
        (b"#!/bin/sh\necho hi\n" * 10, "not an ELF file"),
        (b"\x7fELF\x01\x01\x01" + b"\0" * 57, "not a 64-bit little-endian"),
        (b"\x7fELF\x02\x02\x01" + b"\0" * 57, "not a 64-bit little-endian"),
    ],
)
def test_what_is_not_a_shared_object_says_so(data: bytes, why: str) -> None:
    with pytest.raises(elf.NotASharedObject, match=why):
        elf.parse(data)


def test_an_executable_is_not_a_plugin() -> None:
    python = Path(sys.executable).resolve()
    data = python.read_bytes()
    if data[:4] != b"\x7fELF":
        pytest.skip(f"{python} is not an ELF file")
    with pytest.raises(elf.NotASharedObject):
        so = elf.parse(data)  # a PIE is ET_DYN too: it parses, but has no plugin_version
        so.u32(data, "plugin_version")


# -- the passthrough ---------------------------------------------------------------------


def have_cc() -> None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc})")


def can_build_plugin() -> tuple[int, int, int]:
    """This Slurm's version, when this host can build the real plugin (else skip)."""
    found = header_version((Path("/usr/include"), Path("/usr/local/include")))
    if found is None:
        pytest.skip("Slurm's headers (libslurm-dev) are not installed")
    have_cc()
    if importlib.util.find_spec("cffi") is None:
        pytest.skip(f"no cffi for {sys.executable}")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("Python's headers (python3-dev) are not installed")
    return found[1]


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The passthrough, built as the guard builds it: no Slurm headers, no cffi."""
    have_cc()
    out = tmp_path_factory.mktemp("passthrough")
    code = (
        "import runpy, sys\n"
        "sys.modules['cffi'] = None\n"
        f"sys.argv = ['build_plugin.py', '--passthrough', {str(out)!r}]\n"
        f"runpy.run_path({str(BUILD_SCRIPT)!r}, run_name='__main__')\n"
    )
    env = {**os.environ, "CODA_SLURM_INCLUDE": str(out / "no-headers")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    built = out / "job_submit_coda_passthrough.so"
    assert proc.stdout.strip() == str(built)
    return built


def load_build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coda_build_plugin_guard", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_script_imports_without_slurm_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODA_SLURM_INCLUDE", "/nonexistent")
    module = load_build_script()
    assert callable(module.compile_passthrough)
    assert callable(module.ffibuilder)  # cffi_modules calls it when setup.py builds


@pytest.mark.compiled
def test_the_passthrough_is_a_plugin_of_no_slurm_in_particular(passthrough: Path) -> None:
    data = passthrough.read_bytes()
    so = elf.parse(data)
    assert {"plugin_name", "plugin_type", "plugin_version", "init", "fini"} <= set(so.symbols)
    assert {"job_submit", "job_modify", "coda_passthrough"} <= set(so.symbols)
    assert not [n for n in so.needed if n.startswith(("libpython", "libslurm"))]
    assert so.u32(data, "plugin_version") == 0xC0DA0000  # no Slurm's: the guard writes it
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(passthrough)], capture_output=True, text=True
    ).stdout
    assert "slurm_" not in undefined  # slurm_error is looked up at run time
    patched = so.with_u32(data, "plugin_version", 0x160509)
    patched = so.with_text(patched, "coda_bypass_reason", "why it is bypassed")
    again = elf.parse(patched)
    assert again.u32(patched, "plugin_version") == 0x160509
    reason = again.symbols["coda_bypass_reason"]
    text = patched[reason.file_offset : reason.file_offset + reason.size_bytes]
    assert text.rstrip(b"\0") == b"why it is bypassed"
    assert len(patched) == len(data)


# -- the guard against a stand-in slurmctld ---------------------------------------------


def fake_headers(root: Path, version: tuple[int, int, int]) -> Path:
    (root / "slurm").mkdir(parents=True)
    (root / "slurm" / "slurm_version.h").write_text(
        f"#define SLURM_VERSION_NUMBER {version_number(version):#x}\n"
    )
    return root


def fake_slurmctld(tmp_path: Path, version: tuple[int, int, int]) -> Path:
    path = tmp_path / "slurmctld"
    path.write_text(f"#!/bin/sh\necho 'slurm-wlm {format_version(version)}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def plugin_version_of(path: Path) -> tuple[int, int, int]:
    data = path.read_bytes()
    return version_of_number(elf.parse(data).u32(data, "plugin_version"))


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    """A slurm.conf naming coda, its PluginDir holding the real plugin, a headers dir."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shutil.copy(real_plugin(), plugins / "job_submit_coda.so")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"JobSubmitPlugins=lua,coda\nPluginDir={plugins}:{tmp_path / 'other'}\n")
    return {"conf": conf, "plugins": plugins, "plugin": plugins / "job_submit_coda.so"}


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(coda_slurm, list(args), env=env)
    return result.exit_code, result.output  # stdout and stderr, as a terminal shows them


def test_without_coda_in_job_submit_plugins_there_is_nothing_to_do(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("JobSubmitPlugins=lua\n")
    result = guard(conf, tmp_path / "no-slurmctld")
    assert result.outcome == "disabled" and result.ok
    assert "does not name coda: nothing to do" in result.lines[0]


def test_an_unreadable_slurm_conf_changes_nothing(tmp_path: Path) -> None:
    result = guard(tmp_path / "missing.conf", tmp_path / "no-slurmctld")
    assert result.outcome == "error" and not result.ok
    assert "cannot read" in result.lines[0] and "nothing changed" in result.lines[0]


def test_a_plugin_built_for_this_slurm_and_python_is_left_alone(
    tmp_path: Path, site: dict[str, Path]
) -> None:
    before = site["plugin"].read_bytes()
    version = plugin_version_of(site["plugin"])
    slurmctld = fake_slurmctld(tmp_path, version)
    result = guard(site["conf"], slurmctld)
    assert result.outcome == "good", result.lines
    v = format_version(version)
    py = LIBPYTHON.removeprefix("libpython").split(".so")[0]
    assert result.lines == (
        f"coda-slurm plugin guard: job_submit/coda built for Slurm {v} (Python {py}) "
        f"matches slurmctld {v}",
    )
    assert site["plugin"].read_bytes() == before
    code, _ = run_cli(
        "plugin", "check", "--slurm-conf", str(site["conf"]), "--slurmctld", str(slurmctld)
    )
    assert code == 0


@pytest.mark.compiled
def test_without_headers_for_the_new_slurm_the_passthrough_is_installed_and_says_why(
    tmp_path: Path, site: dict[str, Path], passthrough: Path
) -> None:
    old = plugin_version_of(site["plugin"])
    new = (old[0], old[1], old[2] + 1)  # a micro upgrade: slurmctld refuses the old plugin
    slurmctld = fake_slurmctld(tmp_path, new)
    env = {"CODA_SLURM_INCLUDE": str(fake_headers(tmp_path / "inc", old))}
    args = ["--slurm-conf", str(site["conf"]), "--slurmctld", str(slurmctld)]

    code, said = run_cli("plugin", "check", *args, env=env)
    assert code == 1, said
    assert f"built for Slurm {format_version(old)}, slurmctld is {format_version(new)}" in said
    assert site["plugin"].read_bytes() == Path(real_plugin()).read_bytes()  # check changes nothing

    code, said = run_cli("plugin", "guard", *args, "--passthrough", str(passthrough), env=env)
    assert code == 0, said
    assert "error: " in said and "installed the passthrough" in said
    assert f"Slurm {format_version(new)}'s headers" in said
    assert "Fix: install libslurm-dev, then run `coda-slurm plugin guard`" in said
    data = site["plugin"].read_bytes()
    so = elf.parse(data)
    assert "coda_passthrough" in so.symbols
    assert plugin_version_of(site["plugin"]) == new
    reason = so.symbols["coda_bypass_reason"]
    text = data[reason.file_offset : reason.file_offset + reason.size_bytes].rstrip(b"\0").decode()
    assert "jobs are not changed by coda" in text and "libslurm-dev" in text

    # Each start tries again; while nothing changed the file stays as it is.
    mtime_ns = site["plugin"].stat().st_mtime_ns
    result = guard(site["conf"], slurmctld, passthrough=passthrough, environ={**os.environ, **env})
    assert result.outcome == "passthrough" and not result.ok
    assert "kept the passthrough" in result.lines[-1]
    assert site["plugin"].stat().st_mtime_ns == mtime_ns
    code, _ = run_cli("plugin", "check", *args, env=env)
    assert code == 1


@pytest.mark.compiled
def test_a_plugin_that_embeds_another_python_is_rebuilt_for_this_one(
    tmp_path: Path, site: dict[str, Path]
) -> None:
    version = can_build_plugin()
    if not LIBPYTHON.startswith("libpython3.") or len(LIBPYTHON) < len("libpython3.X.so"):
        pytest.skip(f"this Python's library is {LIBPYTHON}")
    # What a Debian release upgrade leaves behind: the plugin names the old libpython.
    other = "libpython3.99" + LIBPYTHON[len("libpython3.99") :]
    data = site["plugin"].read_bytes().replace(LIBPYTHON.encode() + b"\0", other.encode() + b"\0")
    site["plugin"].write_bytes(data)
    assert other in elf.parse(data).needed
    slurmctld = fake_slurmctld(tmp_path, version)
    environ = {k: v for k, v in os.environ.items() if k != "CODA_SLURM_INCLUDE"}
    result = guard(site["conf"], slurmctld, environ=environ)
    assert result.outcome == "rebuilt", result.lines
    py = LIBPYTHON.removeprefix("libpython").split(".so")[0]
    assert f"job_submit_coda.so embeds Python 3.99 ({other})" in result.lines[0]
    assert f"for Python {py} -> {site['plugin']}" in result.lines[0]
    assert LIBPYTHON in elf.parse(site["plugin"].read_bytes()).needed


def test_with_nothing_to_install_the_old_plugin_stays_as_it_was(
    tmp_path: Path, site: dict[str, Path]
) -> None:
    before = site["plugin"].read_bytes()
    old = plugin_version_of(site["plugin"])
    slurmctld = fake_slurmctld(tmp_path, (old[0], old[1], old[2] + 1))
    empty = tmp_path / "empty"
    empty.mkdir()
    result = guard(
        site["conf"],
        slurmctld,
        source=empty,
        passthrough=tmp_path / "no-passthrough.so",
        environ={**os.environ, "CODA_SLURM_INCLUDE": str(empty)},
    )
    assert result.outcome == "unchanged" and not result.ok
    assert "left as it was" in result.lines[-1]
    assert "install libslurm-dev, coda-slurm" in result.lines[-1]
    assert site["plugin"].read_bytes() == before
    assert sorted(p.name for p in site["plugins"].iterdir()) == ["job_submit_coda.so"]


# -- a real slurmctld, upgraded by a micro release ----------------------------------------

SCRIPT = "#!/bin/sh\nsleep 300\n"


def build_stale_plugin(tmp_path: Path) -> tuple[Path, tuple[int, int, int]]:
    """job_submit_coda.so built against a copy of this Slurm's headers one micro release
    ahead: what a plugin built before a Slurm downgrade (or for the next release) is."""
    running = can_build_plugin()
    if header_version((Path("/usr/include"),)) is None:
        pytest.skip("Slurm's headers are not in /usr/include")
    ahead = (running[0], running[1], running[2] + 1)
    include = tmp_path / "include"
    shutil.copytree("/usr/include/slurm", include / "slurm")
    header = include / "slurm" / "slurm_version.h"
    header.write_text(
        re.sub(
            r"(#define\s+SLURM_VERSION_NUMBER\s+)0x[0-9a-fA-F]+",
            rf"\g<1>{version_number(ahead):#x}",
            header.read_text(),
        )
    )
    env = {**os.environ, "CODA_SLURM_INCLUDE": str(include)}
    out = tmp_path / "stale"
    proc = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    plugin = out / "job_submit_coda.so"
    assert plugin_version_of(plugin) == ahead
    return plugin, running


def guarded_job(cluster: DevCluster, name: str) -> dict[str, str]:
    job_id, _ = cluster.sbatch(
        ["--hold", "--gpus-per-node=1", f"--comment=coda:workload={name}", "-J", name], SCRIPT
    )
    return cluster.show_job(job_id)


def wait_for_profiles(cluster: DevCluster, timeout_s: float = 15.0) -> None:
    """Until the hook has loaded the profile store once (it says so in its stats file)."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if json.loads(cluster.hook_stats_file.read_text()).get("profiles", 0) >= 1:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise AssertionError("the hook did not load the profile store")


@pytest.mark.slurm
def test_after_a_slurm_upgrade_slurmctld_starts_with_coda_rebuilt_or_bypassed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_slurm()
    tmp_path = tmp_path_factory.mktemp("guard")
    stale, running = build_stale_plugin(tmp_path)
    cluster = DevCluster(tmp_path / "cluster", plugin_file=stale)
    cluster.profile_store.mkdir(parents=True)
    ProfileStore(cluster.profile_store).write(
        Profile(
            signature="workload:*:guarded",
            workload="guarded",
            cpus_per_gpu=6,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=time.time(),
            source="test",
        )
    )
    pre_log = cluster.root / "log" / "slurmctld-pre.log"
    # Where coda's Debian package is installed, Slurm's own directory (the cluster's second
    # PluginDir entry) holds a plugin that matches, and slurmctld from 24.11 on goes on to
    # the next entry when one is refused: out of the way, so the stale one is all there is.
    system_dir = find_system_plugin_dir()
    packaged = system_dir / PLUGIN_FILE if system_dir else None
    aside = packaged.with_name(f".{PLUGIN_FILE}.coda-test") if packaged else None
    if packaged and aside and packaged.exists():
        packaged.rename(aside)
    try:
        # Without the guard: slurmctld refuses the plugin and exits.
        with pytest.raises(DevClusterError, match="slurmctld exited"):
            cluster.up()
        refused = cluster.ctld_log.read_text(errors="replace")
        assert "Incompatible Slurm plugin" in refused, refused[-2000:]
        cluster.down()

        # With the guard before it (the systemd drop-in's ExecStartPre): rebuilt.
        cluster.ctld_pre_exec = (
            sys.executable,
            "-m",
            "slurm_plugin.cli.main",
            "plugin",
            "guard",
            "--slurm-conf",
            str(cluster.slurm_conf),
        )
        cluster.up()
        said = pre_log.read_text()
        ahead = (running[0], running[1], running[2] + 1)
        assert (
            f"job_submit_coda.so was built for Slurm {format_version(ahead)}, slurmctld is "
            f"{format_version(running)}: rebuilt against /usr/include "
            f"({format_version(running)})"
        ) in said, said
        assert plugin_version_of(cluster.plugin_dir / "job_submit_coda.so") == running
        wait_for_profiles(cluster)
        assert guarded_job(cluster, "guarded").get("CpusPerTres") == gres("gres:gpu:6")
        cluster.down()

        # Without Slurm's headers: the passthrough; slurmctld starts, jobs pass unchanged.
        pre_log.write_text("")
        empty = tmp_path / "no-headers"
        empty.mkdir()
        cluster.ctld_env = {"CODA_SLURM_INCLUDE": str(empty)}
        cluster.up()
        said = pre_log.read_text()
        assert "error: " in said and "installed the passthrough" in said, said
        assert "Fix: install libslurm-dev, then run `coda-slurm plugin guard`" in said
        fields = guarded_job(cluster, "guarded")
        assert fields.get("CpusPerTres") != gres("gres:gpu:6")
        assert "coda" not in (fields.get("AdminComment") or "")
        log = cluster.ctld_log.read_text(errors="replace")
        assert "job_submit/coda: passthrough: coda is bypassed" in log
    finally:
        cluster.down()
        if packaged and aside and aside.exists():
            aside.rename(packaged)


@pytest.mark.parametrize(
    ("os_release", "rpm"),
    [
        ('ID=debian\nVERSION_ID="12"\n', False),
        ("ID=ubuntu\nID_LIKE=debian\n", False),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', True),
        ('ID="almalinux"\nID_LIKE="rhel centos fedora"\n', True),
        ('ID="rhel"\nID_LIKE="fedora"\n', True),
        ("ID=fedora\n", True),
        ('ID="opensuse-leap"\nID_LIKE="suse opensuse"\n', False),
        ("", False),
    ],
)
def test_the_fix_names_the_rhel_family_packages_on_an_rpm_system(
    os_release: str, rpm: bool
) -> None:
    assert rpm_family(os_release) is rpm
    headers = package_name("libslurm-dev", rpm_family(os_release))
    assert headers == ("slurm-devel" if rpm else "libslurm-dev")
    assert package_name("python3-dev", rpm) == ("python3-devel" if rpm else "python3-dev")
    assert package_name("gcc", rpm) == "gcc" and package_name("python3-cffi", rpm) == "python3-cffi"
