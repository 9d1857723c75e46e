"""coda's RPM packages as scripts/build-rpms builds them from this tree (rpm/coda-slurm.spec,
with Debian's rpmbuild and rpmlint here): the split of the Debian packages, a plugin package
whose Release names the Slurm it was built for and that requires that slurmctld, the
licence of each package, the files each holds, its scriptlets, and rpmlint's verdict.

Installing the packages needs a RHEL-family system and cannot be done here
(docs/admin-guide.md, "RHEL-family sites"); these read the built files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_plugin.hook.guard import PluginFile, format_version, header_version, read_plugin

pytestmark = pytest.mark.rpm

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("rpmbuild", "rpmlint", "rpm", "rpm2cpio", "cpio")
SLURM_PLUGIN_DIR = "/usr/lib64/slurm"
BIN_ARCH = "x86_64" if os.uname().machine == "x86_64" else os.uname().machine
NOARCH = {"coda-common", "python3-coda-common"}
GPL = "GPL-2.0-or-later"


@dataclass(frozen=True, slots=True)
class Built:
    rpms: dict[str, Path]
    """Binary packages by name, and the source package as ``src``."""
    log: str
    """What scripts/build-rpms printed (rpmlint's report included)."""
    root: Path
    """Every binary package unpacked into one tree."""


def _require_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (Debian's rpm and rpmlint; run scripts/setup)"
    # scripts/test sets CODA_REQUIRE_RPM=1: there a missing rpmbuild is a failure.
    if os.environ.get("CODA_REQUIRE_RPM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _rpm(*args: str) -> str:
    return subprocess.run(["rpm", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    _require_tools()
    out = tmp_path_factory.mktemp("rpms")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-rpms"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    rpms: dict[str, Path] = {}
    root = out / "root"
    root.mkdir()
    for path in sorted(out.glob("*.rpm")):
        if path.name.endswith(".src.rpm"):
            rpms["src"] = path
            continue
        rpms[_rpm("-qp", "--qf", "%{NAME}", str(path))] = path
        cpio = subprocess.run(["rpm2cpio", str(path)], capture_output=True, check=True).stdout
        subprocess.run(["cpio", "-idm", "--quiet"], input=cpio, cwd=root, check=True)
    yield Built(rpms, log, root)


def _tag(path: Path, tag: str) -> str:
    return _rpm("-qp", "--qf", f"%{{{tag}}}", str(path))


def _files(path: Path) -> set[str]:
    return set(_rpm("-qlp", str(path)).splitlines())


def _debian_packages() -> dict[str, str]:
    """Package name -> Architecture, from debian/control."""
    stanzas = (REPO / "debian" / "control").read_text().split("\n\n")
    found = {}
    for stanza in stanzas:
        name = re.search(r"^Package: (\S+)", stanza, re.M)
        arch = re.search(r"^Architecture: (\S+)", stanza, re.M)
        if name and arch:
            found[name.group(1)] = arch.group(1)
    return found


def test_the_rpms_are_the_debian_split_noarch_where_debian_is_arch_all(built: Built) -> None:
    debian = _debian_packages()
    assert set(built.rpms) - {"src"} == set(debian)
    for name, path in built.rpms.items():
        if name == "src":
            continue
        arch = _tag(path, "ARCH")
        assert arch == ("noarch" if debian[name] == "all" else BIN_ARCH), (name, arch)
        assert (name in NOARCH) == (arch == "noarch"), name
    versions = {_tag(p, "VERSION") for p in built.rpms.values()}
    setup_version = re.search(r'version="([^"]+)"', (REPO / "setup.py").read_text())
    changelog = (REPO / "debian" / "changelog").read_text().split("\n", 1)[0]
    assert setup_version is not None
    assert versions == {setup_version.group(1)}
    assert f"({setup_version.group(1)})" in changelog


def _slurm_headers_version() -> str:
    # The spec's slurm_include: %{_includedir}.
    found = header_version([Path("/usr/include")])
    assert found is not None, "no slurm/slurm_version.h: scripts/setup installs libslurm-dev"
    return format_version(found[1])


def _built_plugin(built: Built) -> PluginFile:
    plugin = read_plugin(built.root / SLURM_PLUGIN_DIR.lstrip("/") / "job_submit_coda.so")
    assert plugin.unreadable is None and not plugin.passthrough, plugin
    return plugin


def test_the_plugin_release_names_the_slurm_it_was_built_for_and_requires_it(
    built: Built,
) -> None:
    """The Release says the Slurm micro release the .so's plugin_version holds, which is
    the one whose headers the build read; the package requires that slurmctld, SchedMD's
    or OpenHPC's, and the libpython the .so embeds."""
    plugin = _built_plugin(built)
    assert plugin.version is not None
    version = format_version(plugin.version)
    assert version == _slurm_headers_version()
    package = built.rpms["coda-slurm-plugin"]
    assert _tag(package, "RELEASE") == f"1.slurm{version}"
    assert (
        package.name
        == f"coda-slurm-plugin-{_tag(package, 'VERSION')}-1.slurm{version}.{BIN_ARCH}.rpm"
    )
    assert f"Slurm {version}" in _tag(package, "SUMMARY")
    requires = _rpm("-qpR", str(package)).splitlines()
    exact = f"(slurm-slurmctld = {version} or slurm-slurmctld-ohpc = {version})"
    assert exact in requires, requires
    assert f"{plugin.libpython}()(64bit)" in requires, requires
    assert plugin.libpython == f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    coda_slurm = f"coda-slurm({BIN_ARCH.replace('_', '-')}) = {_tag(package, 'VERSION')}-1"
    assert coda_slurm in requires, requires


def test_each_package_requires_its_siblings_and_the_python_modules_it_imports(
    built: Built,
) -> None:
    def requires(name: str) -> list[str]:
        return _rpm("-qpR", str(built.rpms[name])).splitlines()

    version = _tag(built.rpms["coda-slurm"], "VERSION")
    py = f"python{sys.version_info.major}.{sys.version_info.minor}dist"
    for name in ("coda-slurm", "coda-node"):
        assert f"coda-common = {version}-1" in requires(name), name
        assert f"python3-coda-common = {version}-1" in requires(name), name
        assert "(slurm or slurm-ohpc)" in requires(name), name
    assert f"{py}(numpy) >= 1.24" in requires("coda-slurm")
    assert f"{py}(prometheus-client) >= 0.16" in requires("coda-node")
    assert any(r.startswith(f"{py}(cffi) >= ") for r in requires("coda-node"))
    common = requires("python3-coda-common")
    assert f"python(abi) = {sys.version_info.major}.{sys.version_info.minor}" in common
    # The dist-info's requirements are not turned into Requires: no package needs
    # nvidia-ml-py (not in RHEL) or psutil.
    assert not [r for r in common if "nvidia-ml-py" in r or "psutil" in r], common
    recommends = _rpm("-qp", "--recommends", str(built.rpms["coda-slurm"])).splitlines()
    assert "coda-slurm-plugin" in recommends and "(slurm-devel or slurm-devel-ohpc)" in recommends


def test_every_package_is_gpl2_or_later_with_its_licence_text(built: Built) -> None:
    licence = (REPO / "LICENSE").read_text()
    for name, path in built.rpms.items():
        tag = _tag(path, "LICENSE")
        # coda-slurm (and so its source package) also ships two Apache-2.0 job traces.
        expected = f"{GPL} AND Apache-2.0" if name in ("coda-slurm", "src") else GPL
        assert tag == expected, (name, tag)
        if name != "src":
            version = _tag(path, "VERSION")
            text = built.root / f"usr/share/licenses/{name}-{version}/LICENSE"
            assert text.read_text() == licence, name


def _python_dir(files: set[str], package: str) -> str:
    (init,) = [f for f in files if f.endswith(f"/site-packages/{package}/__init__.py")]
    return init.removesuffix("/__init__.py")


def test_each_package_holds_its_part_and_no_file_is_in_two(built: Built) -> None:
    files = {n: _files(p) for n, p in built.rpms.items() if n != "src"}
    slurm, node, common = files["coda-slurm"], files["coda-node"], files["python3-coda-common"]
    assert {"/usr/bin/coda-slurm", "/usr/share/man/man1/coda-slurm.1.gz"} <= slurm
    assert {
        "/usr/lib/coda-slurm/job_submit_coda_passthrough.so",
        "/usr/lib/coda-slurm/refuse-removal",
        "/usr/share/coda-slurm/plugin-src/build_plugin.py",
        "/usr/share/coda-slurm/plugin-src/job_submit_coda.c",
        "/usr/lib/systemd/system/coda-collect.service",
        "/usr/lib/systemd/system/coda-reserve.service",
        "/usr/lib/systemd/system/slurmctld.service.d/coda-plugin-guard.conf",
        "/var/spool/coda/drop",
    } <= slurm
    assert _python_dir(slurm, "slurm_plugin").startswith("/usr/lib/python3.")
    assert {"/usr/bin/coda-node", "/usr/share/man/man1/coda-node.1.gz"} <= node
    assert "/usr/lib/systemd/system/coda-node.service" in node
    assert _python_dir(node, "coda_node") + "/_perf.abi3.so" in node
    assert _python_dir(common, "coda_common").startswith("/usr/lib/python3.")
    assert any(f.endswith(".dist-info/METADATA") for f in common)
    assert "/etc/slurm/coda.conf" in files["coda-common"]
    configs = _rpm("-qp", "--configfiles", str(built.rpms["coda-common"])).split()
    assert configs == ["/etc/slurm/coda.conf"]
    plugin_files = {f for f in files["coda-slurm-plugin"] if "/licenses/" not in f}
    assert {f for f in plugin_files if not f.startswith("/usr/lib/.build-id")} == {
        f"{SLURM_PLUGIN_DIR}/job_submit_coda.so"
    }
    # Each Python package in exactly one RPM; no path but directories in two.
    owners: dict[str, list[str]] = {}
    for name, paths in files.items():
        for f in paths:
            owners.setdefault(f, []).append(name)
    shared = {f for f, o in owners.items() if len(o) > 1 and not (built.root / f[1:]).is_dir()}
    assert shared == set()
    for package, owner in (("coda_common", "python3-coda-common"), ("slurm_plugin", "coda-slurm")):
        holders = {n for n, p in files.items() if any(f"/{package}/" in f for f in p)}
        assert holders == {owner}, package


def test_units_and_drop_dir_are_as_the_debian_packages_have_them(built: Built) -> None:
    units = built.root / "usr/lib/systemd/system"
    guard = (units / "slurmctld.service.d/coda-plugin-guard.conf").read_text()
    assert "ExecStartPre=-/usr/bin/coda-slurm plugin guard" in guard
    node = (units / "coda-node.service").read_text()
    assert "ExecStart=/usr/bin/coda-node run" in node
    assert "ExecStopPost=/usr/bin/coda-node restore" in node
    assert "Documentation=man:coda-node(1)" in node
    for unit in ("coda-node", "coda-collect", "coda-reserve"):
        assert "/opt/coda" not in (units / f"{unit}.service").read_text(), unit
    modes = _rpm(
        "-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]", str(built.rpms["coda-slurm"])
    )
    assert "drwx-wx-wt /var/spool/coda/drop" in modes.splitlines()
    conf = (built.root / "etc/slurm/coda.conf").read_text()
    assert [line for line in conf.splitlines() if line and not line.startswith("#")] == []


_SCRIPTLET = re.compile(r"^(\w+) scriptlet \(using ([^)]+)\)(?: -- (\S+))?:?$", re.M)


def _scriptlets(path: Path) -> dict[str, str]:
    """Scriptlet kind (``preuninstall``, ``transfiletriggerin /usr/lib64/slurm``) -> body."""
    text = _rpm("-qp", "--scripts", "--filetriggers", str(path))
    heads = list(_SCRIPTLET.finditer(text))
    found: dict[str, str] = {}
    ends = [h.start() for h in heads[1:]] + [len(text)] if heads else []
    for head, end in zip(heads, ends, strict=True):
        body = text[head.end() : end]
        assert head.group(2) == "/bin/sh", head.group(0)
        found[" ".join(g for g in (head.group(1), head.group(3)) if g)] = body
    return found


def test_scriptlets_refuse_removal_restore_jobs_and_report_the_plugin(built: Built) -> None:
    slurm = _scriptlets(built.rpms["coda-slurm"])
    assert "/usr/lib/coda-slurm/refuse-removal coda-slurm || exit 1" in slurm["preuninstall"]
    assert "chown root:slurm /var/lib/coda" in slurm["postinstall"]
    assert "preset coda-collect.service coda-reserve.service" in slurm["postinstall"]
    assert "try-restart coda-collect.service coda-reserve.service" in slurm["postuninstall"]
    trigger = slurm[f"transfiletriggerin {SLURM_PLUGIN_DIR}"]
    assert "/usr/bin/coda-slurm plugin check || :" in trigger
    node = _scriptlets(built.rpms["coda-node"])
    assert "systemctl stop coda-node.service" in node["preinstall"]
    assert "/usr/bin/coda-node restore" in node["preinstall"]
    assert "disable --now coda-node.service" in node["preuninstall"]
    assert "/usr/bin/coda-node restore" in node["preuninstall"]
    assert "systemctl start coda-node.service" in node["posttrans"]
    for name in ("coda-common", "python3-coda-common", "coda-slurm-plugin"):
        assert _scriptlets(built.rpms[name]) == {}, name
    for kind, body in [*slurm.items(), *node.items()]:
        proc = subprocess.run(["sh", "-n"], input=body, capture_output=True, text=True)
        assert proc.returncode == 0, (kind, proc.stderr)


def test_rpmlint_is_clean_and_every_filter_says_why(built: Built) -> None:
    summary = re.search(
        r"(\d+) packages and (\d+) specfiles checked; (\d+) errors, (\d+) warnings", built.log
    )
    assert summary is not None, built.log[-3000:]
    assert summary.group(1, 2) == (str(len(built.rpms)), "1")
    assert summary.group(3, 4) == ("0", "0"), built.log[-3000:]
    lines = (REPO / "rpm" / "coda-slurm.rpmlintrc").read_text().splitlines()
    filters = [i for i, line in enumerate(lines) if line.startswith("addFilter(")]
    assert filters
    for i in filters:
        above = i - 1
        while above >= 0 and lines[above].startswith("addFilter("):
            above -= 1
        assert above >= 0 and lines[above].startswith("#"), f"no comment says why: {lines[i]}"
