"""SchedMD's Python testsuite (the ATF: ``testsuite/python`` of Slurm's source) for the Slurm
that is installed, and the Python it runs on.

The source is Debian's ``slurm-wlm`` source package of the installed version, fetched with
``apt-get source`` from the mirrors this system's apt already uses (their ``deb`` lines
read as ``deb-src``, in a private apt state: the system's own lists and caches are not
touched) and unpacked once with ``dpkg-source`` into ``/var/cache/coda-slurm/schedmd/<version>``.
Slurm 25.11 and later release no ``testsuite/python`` (SchedMD keeps the ATF on its
``master`` branch, version-gated with ``atf.require_version``); for those, or where the mirror
lacks the source, a Slurm source tree or tarball given with ``--source`` fills the cache.

The ATF runs on Debian's ``python3`` with the Debian packages of what it imports (pytest,
pexpect, and the JSON, YAML and HTTP modules of newer ATFs; on bookworm pytest 7 brings the
``python3-py`` whose ``py.io`` the 22.05 conftest imports), installed with apt when missing;
never on coda's virtualenv.  SchedMD's master ATF runs its commands through ``sudo`` even as
root: for it, sudo and a sudoers drop-in that keeps ``SLURM_CONF`` (:data:`SUDOERS`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(os.environ.get("CODA_SCHEDMD_CACHE", "/var/cache/coda-slurm/schedmd"))
ATF = Path("testsuite/python")
"""Where the ATF is inside a Slurm source tree."""
SOURCE = "source"
"""The unpacked source inside a version's cache directory."""
ORIGIN = "origin"
"""One line inside a version's cache directory: where the source came from."""
ATF_PYTHON = Path("/usr/bin/python3")
"""Debian's Python: the ATF's own interpreter (its pytest and pexpect from Debian)."""
ATF_PACKAGES = (
    "python3-pytest",
    "python3-pexpect",
    "python3-jsondiff",
    "python3-jsonpatch",
    "python3-requests",
    "python3-yaml",
    "python3-xmltodict",
)
"""What the ATF imports (its lib/atf.py and tests), from Debian."""
ATF_MODULES = ("pytest", "pexpect", "jsondiff", "jsonpatch", "requests", "yaml", "xmltodict")
APT_TIMEOUT_S = 600.0


class Unavailable(RuntimeError):
    """The testsuite (or what runs it) cannot be had on this machine; says why."""


@dataclass(frozen=True, slots=True)
class Installed:
    """The Slurm that runs here."""

    version: str
    """Upstream, as ``slurmctld -V`` prints it: ``22.05.8``."""
    source_package: str | None
    """Debian's source package of slurmctld (``slurm-wlm``); None off Debian."""
    source_version: str | None
    """Its exact Debian version (``22.05.8-4+deb12u3``)."""


@dataclass(frozen=True, slots=True)
class Testsuite:
    source_dir: Path
    """The unpacked Slurm source (testsuite.conf's SlurmSourceDir)."""
    origin: str

    @property
    def atf_dir(self) -> Path:
        return self.source_dir / ATF


def installed_slurm() -> Installed:
    try:
        out = subprocess.run(
            ["slurmctld", "-V"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"no slurmctld to run the testsuite against ({exc})") from None
    words = out.split()
    if not words or not re.fullmatch(r"\d+\.\d+\.\d+", words[-1]):
        raise Unavailable(f"cannot read a Slurm version from slurmctld -V: {out.strip()!r}")
    package = version = None
    if shutil.which("dpkg-query"):
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}", "slurmctld"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode == 0 and len(proc.stdout.split()) == 2:
            package, version = proc.stdout.split()
    return Installed(words[-1], package, version)


def cached(version: str, cache_dir: Path = CACHE_DIR) -> Testsuite | None:
    """The testsuite of ``version`` unpacked in the cache, if it is there."""
    here = cache_dir / version
    if not (here / SOURCE / ATF / "conftest.py").is_file():
        return None
    origin = (here / ORIGIN).read_text().strip() if (here / ORIGIN).is_file() else "unknown"
    return Testsuite(here / SOURCE, origin)


def ensure(
    installed: Installed, given: Path | None = None, cache_dir: Path = CACHE_DIR
) -> Testsuite:
    """The testsuite for ``installed``: from the cache, else from ``given`` (a Slurm source
    tree or tarball), else fetched from Debian's mirror; raise Unavailable when none has it."""
    if given is None and (found := cached(installed.version, cache_dir)) is not None:
        return found
    unserved = cache_dir / f"{installed.version}{UNSERVED_SUFFIX}"
    if given is None and _fresh(unserved):
        return served_instead(installed, unserved.read_text().strip(), cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Staged beside the cache entry and renamed into place: a run stopped half way leaves
    # no entry that looks complete.
    staging = Path(tempfile.mkdtemp(prefix=f".{installed.version}.", dir=cache_dir))
    try:
        staged = staging / SOURCE
        if given is not None:
            origin = _copy_given(given, staged)
        else:
            try:
                origin = _fetch_debian(installed, staging, staged)
                if not (staged / ATF / "conftest.py").is_file():
                    raise Unavailable(f"Debian's {installed.source_version} source has no {ATF}")
            except Unavailable as exc:
                shutil.rmtree(staging, ignore_errors=True)
                why = f"{exc}{_release_hint(installed)}"
                unserved.write_text(why + "\n")
                return served_instead(installed, why, cache_dir)
        if not (staged / ATF / "conftest.py").is_file():
            raise Unavailable(f"{origin} has no {ATF}{_release_hint(installed)}")
        _install_staged(staging, origin, cache_dir / installed.version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    found = cached(installed.version, cache_dir)
    assert found is not None
    return found


SERVED_SUITE = "bookworm"
"""The Debian suite whose ``slurm-wlm`` source (22.05.8, with its ATF) the mirror serves.
Debian's mirrors list the source packages of trixie and sid (24.11, 26.05) but the pool
serves no files for them here (``.dsc`` 404), and Slurm 25.11 and later release no ATF."""


def served_instead(installed: Installed, why: str, cache_dir: Path = CACHE_DIR) -> Testsuite:
    """Where the installed Slurm's own testsuite cannot be had (``why``): the testsuite of
    the source the mirror does serve (:data:`SERVED_SUITE`), from the cache or fetched once,
    to run against the installed Slurm with coda and without it. Outcomes that differ from
    its own release (tests of options or output that changed since) fail on both sides and
    cancel out in the comparison; what remains is what coda changes. Raises Unavailable
    when that source cannot be had either."""
    note = f"; Slurm {installed.version}'s own testsuite: {why}"
    for entry in sorted(cache_dir.glob("*")) if cache_dir.is_dir() else []:
        found = cached(entry.name, cache_dir)
        if found is not None and (entry / SERVED_MARK).is_file():
            return Testsuite(found.source_dir, found.origin + note)
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".served.", dir=cache_dir))
    try:
        staged = staging / SOURCE
        origin, version = _fetch_served(staging, staged)
        if not (staged / ATF / "conftest.py").is_file():
            raise Unavailable(f"{origin} has no {ATF}")
        (staging / SERVED_MARK).write_text(SERVED_SUITE + "\n")
        _install_staged(staging, origin, cache_dir / version)
    except Unavailable as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise Unavailable(f"{why}; nor {SERVED_SUITE}'s source instead: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    found = cached(version, cache_dir)
    assert found is not None
    return Testsuite(found.source_dir, found.origin + note)


UNSERVED_SUFFIX = ".unserved"
"""``<cache>/<version>.unserved``: why that version's own testsuite could not be had; for
:data:`UNSERVED_TTL_S` the served one is used without asking the mirror again."""
UNSERVED_TTL_S = 7 * 86400.0


def _fresh(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < UNSERVED_TTL_S
    except OSError:
        return False


SERVED_MARK = "served"
"""A file in a cache entry fetched as :func:`served_instead`'s testsuite."""


def _fetch_served(tmp: Path, dest: Path) -> tuple[str, str]:
    """``slurm-wlm``'s source from :data:`SERVED_SUITE` on the mirror this system uses:
    (origin, upstream version)."""
    ensure_tools(("dpkg-dev",), ("dpkg-source",))
    options = _private_apt(tmp / "apt")
    mirror = _mirror_uri(tmp / "apt")
    (tmp / "apt" / "sources.list.d" / "coda-served.list").write_text(
        f"deb-src {mirror} {SERVED_SUITE} main\n"
    )
    dsc = _apt_source(options, f"slurm-wlm/{SERVED_SUITE}", tmp / "download", dest)
    debian_version = dsc.stem.split("_", 1)[1]
    upstream = debian_version.split("-", 1)[0].split(":")[-1]
    return f"Debian slurm-wlm={debian_version} ({SERVED_SUITE})", upstream


def _mirror_uri(state: Path) -> str:
    """The first Debian archive URI of the private apt state's sources."""
    files = [state / "sources.list", *sorted((state / "sources.list.d").glob("*"))]
    for f in files:
        for line in f.read_text().splitlines() if f.is_file() else []:
            words = line.split()
            if words[:1] == ["deb-src"]:
                uris = [w for w in words[1:] if "://" in w]
            elif words[:1] and words[0].lower() == "uris:":
                uris = words[1:]
            else:
                continue
            for uri in uris:
                if "security" not in uri:
                    return uri
    raise Unavailable("no Debian archive in this system's apt sources")


def _install_staged(staging: Path, origin: str, final: Path) -> None:
    """Make the staged cache entry ``final``: its scratch (apt's state, the downloads, the
    tarballs dpkg-source links beside its target) removed, its origin written, renamed
    into place (a run stopped half way leaves no entry that looks complete)."""
    for scratch in staging.iterdir():
        if scratch.name not in (SOURCE, SERVED_MARK):
            shutil.rmtree(scratch) if scratch.is_dir() else scratch.unlink()
    (staging / ORIGIN).write_text(origin + "\n")
    staging.chmod(0o755)
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)


def _release_hint(installed: Installed) -> str:
    """What to do where Slurm's release source cannot have the ATF."""
    major_minor = tuple(int(x) for x in installed.version.split(".")[:2])
    if major_minor < (25, 11):
        return ""
    return (
        " (Slurm 25.11 and later release no ATF: SchedMD keeps it on its master branch; "
        "give a checkout of that with --source)"
    )


def _copy_given(given: Path, dest: Path) -> str:
    if given.is_dir():
        shutil.copytree(given, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        return f"source tree {given}"
    if given.is_file() and tarfile.is_tarfile(given):
        unpack = dest.parent / "unpack"
        unpack.mkdir()
        _run(["tar", "-xf", str(given.resolve())], unpack, f"tar -xf {given}")
        # A release tarball holds one top folder (slurm-22.05.8/); git archive holds none.
        tops = [d for d in unpack.iterdir() if d.is_dir()]
        top = tops[0] if len(tops) == 1 and (tops[0] / ATF).is_dir() else unpack
        top.rename(dest)
        return f"tarball {given}"
    raise Unavailable(f"--source {given}: neither a directory nor a tarball")


def deb_src_sources(name: str, text: str) -> str | None:
    """An apt sources file with its binary entries made source entries: one-line ``deb``
    lines (``.list``) become ``deb-src`` lines, deb822 stanzas (``.sources``) of
    ``Types: deb`` become ``Types: deb-src``; None when it has no binary entry."""
    out: list[str] = []
    found = False
    for line in text.splitlines():
        if name.endswith(".sources"):
            m = re.match(r"(?i)^types:\s*(.*)$", line)
            if m and "deb" in m.group(1).split():
                line, found = "Types: deb-src", True
        elif re.match(r"^\s*deb\s", line):
            line, found = re.sub(r"^\s*deb\s", "deb-src ", line, count=1), True
        out.append(line)
    return "\n".join(out) + "\n" if found else None


def _apt_options(state: Path) -> list[str]:
    return [
        "-o",
        f"Dir::Etc::SourceList={state / 'sources.list'}",
        "-o",
        f"Dir::Etc::SourceParts={state / 'sources.list.d'}",
        "-o",
        f"Dir::State::Lists={state / 'lists'}",
        "-o",
        f"Dir::Cache={state / 'cache'}",
        "-o",
        "APT::Sandbox::User=root",
        "-o",
        "Acquire::Check-Valid-Until=false",
    ]


def _private_apt(state: Path, etc: Path = Path("/etc/apt")) -> list[str]:
    """apt options for a private state whose sources are the system's, as deb-src."""
    (state / "sources.list.d").mkdir(parents=True)
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True)
    written = 0
    for f in [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*"))]:
        if not f.is_file() or not f.name.endswith((".list", ".sources")):
            continue
        text = deb_src_sources(f.name, f.read_text())
        if text is not None:
            main = f == etc / "sources.list"
            (state / "sources.list" if main else state / "sources.list.d" / f.name).write_text(text)
            written += 1
    if not written:
        raise Unavailable(f"no Debian mirror in {etc}/sources.list*")
    (state / "sources.list").touch()
    return _apt_options(state)


def _run(argv: list[str], cwd: Path, what: str) -> None:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"{what}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("E:")] or lines[-1:]
        raise Unavailable(f"{what}: {errors[0] if errors else f'exit {proc.returncode}'}")


def _fetch_debian(installed: Installed, tmp: Path, dest: Path) -> str:
    if installed.source_package is None or installed.source_version is None:
        raise Unavailable("Slurm is not installed from Debian packages (no dpkg record)")
    ensure_tools(("dpkg-dev",), ("dpkg-source",))
    spec = f"{installed.source_package}={installed.source_version}"
    _apt_source(_private_apt(tmp / "apt"), spec, tmp / "download", dest)
    return f"Debian {spec}"


def _apt_source(options: list[str], spec: str, download: Path, dest: Path) -> Path:
    """``apt-get source spec`` with the private apt ``options``, downloaded into
    ``download`` and unpacked to ``dest``; returns the ``.dsc`` it unpacked."""
    download.mkdir()
    _run(["apt-get", "-q", *options, "update"], download, "apt-get update (deb-src)")
    _run(
        ["apt-get", "-q", *options, "source", "--download-only", spec],
        download,
        f"apt-get source {spec}",
    )
    dscs = sorted(download.glob("slurm-wlm_*.dsc")) or sorted(download.glob("*.dsc"))
    if not dscs:
        raise Unavailable(f"apt-get source {spec} left no .dsc")
    _run(["dpkg-source", "-x", str(dscs[0]), str(dest)], download, f"dpkg-source -x {dscs[0]}")
    shutil.rmtree(download)
    return dscs[0]


def ensure_tools(packages: tuple[str, ...], commands: tuple[str, ...]) -> None:
    """Install Debian ``packages`` with apt unless every one of ``commands`` is there."""
    if all(shutil.which(c) for c in commands):
        return
    _apt_install(packages)


def ensure_atf_python(python: Path = ATF_PYTHON) -> Path:
    """Debian's python3 with the ATF's modules, installing them with apt when missing."""
    check = [str(python), "-c", "import " + ", ".join(ATF_MODULES)]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    _apt_install(ATF_PACKAGES)
    if subprocess.run(check, capture_output=True).returncode != 0:
        raise Unavailable(f"{python} cannot import {', '.join(ATF_MODULES)}")
    return python


@functools.cache
def py_io_missing(python: Path = ATF_PYTHON) -> bool:
    """Whether the ATF's Python lacks ``py.io`` (the py library, which Slurm 22.05's conftest
    imports, is gone from Debian 13 on): the guard then puts tests/schedmd/atf-compat first."""
    check = [str(python), "-c", "import py.io"]
    try:
        return subprocess.run(check, capture_output=True, timeout=60).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return False


WRAPPER = """\
#!/bin/bash
# Written by coda's tests/schedmd/run-suite: Debian's Slurm says "slurm-wlm X.Y.Z" to -V and
# --version, SchedMD's testsuite reads "slurm X.Y.Z" (its atf.get_version, its --version
# tests).  Everything else goes to {real} unchanged, under the name it was called by
# (the --json tests compare it with meta.command).
set -o pipefail
case "${{1:-}}" in
-V | --version) {real} "$@" | sed 's/^slurm-wlm /slurm /' ;;
*) exec -a "${{0##*/}}" {real} "$@" ;;
esac
"""


def slurm_commands() -> list[Path]:
    """Every program in /usr/bin and /usr/sbin that is (or, through Debian's alternatives,
    links to) a file of Debian's Slurm packages: ``/usr/sbin/slurmctld`` is
    ``slurmctld-wlm``."""
    listing = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${source:Package}\n"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    packages = [
        ln.split()[0] for ln in listing.stdout.splitlines() if ln.split()[1:] == ["slurm-wlm"]
    ]
    if not packages:
        return []
    owned = set(
        subprocess.run(
            ["dpkg-query", "-L", *packages], capture_output=True, text=True, timeout=60
        ).stdout.split()
    )
    found = []
    for directory in (Path("/usr/bin"), Path("/usr/sbin")):
        for entry in directory.iterdir():
            if (
                entry.is_file()
                and os.access(entry, os.X_OK)
                and (str(entry) in owned or os.path.realpath(entry) in owned)
            ):
                found.append(entry)
    return sorted(found)


def make_prefix(prefix: Path) -> Path:
    """A Slurm install prefix for the ATF (its SlurmInstallDir, its PATH first): ``bin``
    and ``sbin`` hold a wrapper per Slurm program that answers -V and --version as
    SchedMD's own builds do; ``include`` and ``lib`` are the system's (the ATF compiles a
    few tests against libslurm).  Off Debian, or where Slurm does not call itself slurm-wlm,
    the wrappers just run the program."""
    for sub in ("bin", "sbin"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("include", "lib"):
        if not (prefix / sub).exists():
            (prefix / sub).symlink_to(Path("/usr") / sub)
    for real in slurm_commands() if shutil.which("dpkg-query") else []:
        wrapper = prefix / real.parent.name / real.name
        wrapper.write_text(WRAPPER.format(real=real))
        wrapper.chmod(0o755)
    return prefix


SUDOERS = Path("/etc/sudoers.d/coda-schedmd-atf")
SUDOERS_TEXT = """\
# Written by coda's tests/schedmd/run-suite for SchedMD's testsuite (ATF): it runs Slurm's
# commands through sudo even as root, wants NOPASSWD, and must keep SLURM_CONF, which names
# the dev cluster it tests.  Root's rights are unchanged.
Defaults env_keep += "SLURM_CONF"
root ALL=(ALL:ALL) NOPASSWD: ALL
"""


def atf_needs_sudo(atf_dir: Path) -> bool:
    """Whether this ATF runs every command given a user through sudo, the user root too
    (SchedMD's master; the 22.05 ATF runs commands as root directly)."""
    text = (atf_dir / "lib" / "atf.py").read_text(errors="replace")
    return '"test-user-set"' in text and '"sudo",' in text


def ensure_sudo() -> None:
    """sudo, and the drop-in that lets the ATF's sudo run as root with SLURM_CONF kept."""
    ensure_tools(("sudo",), ("sudo", "visudo"))
    if SUDOERS.exists() and SUDOERS.read_text() == SUDOERS_TEXT:
        return
    staged = SUDOERS.with_name(".coda-schedmd-atf.new")
    staged.write_text(SUDOERS_TEXT)
    staged.chmod(0o440)
    check = subprocess.run(["visudo", "-cqf", str(staged)], capture_output=True, text=True)
    if check.returncode != 0:
        staged.unlink()
        raise Unavailable(f"visudo refuses the ATF's sudoers drop-in: {check.stderr.strip()}")
    staged.rename(SUDOERS)


def _apt_install(packages: tuple[str, ...]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
            capture_output=True,
            text=True,
            env=env,
            timeout=APT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"apt-get install {' '.join(packages)}: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise Unavailable(f"apt-get install {' '.join(packages)}: {last}")
