"""Before slurmctld starts: make sure the job_submit/coda it will load is one it accepts.

slurmctld exits when a plugin named in ``JobSubmitPlugins`` is missing or was built for
another Slurm: its loader (src/common/plugin.c) compares the plugin's ``plugin_version``
with its own ``SLURM_VERSION_NUMBER``, micro release included, says ``Incompatible Slurm
plugin ... version`` and ``fatal: failed to initialize job_submit plugin``.  And
job_submit_coda.so embeds one libpython (its DT_NEEDED ``libpython3.X.so.1.0``): after a
Python upgrade it would start the wrong Python or not load at all.  So a Slurm or Python
upgrade could stop the cluster's scheduler because of coda.

coda fails open by design: a Slurm that runs without coda's changes is the safe state.
The guard (``coda-slurm plugin guard``, run as slurmctld's ``ExecStartPre``) therefore

1. reads slurm.conf's ``JobSubmitPlugins`` and ``PluginDir`` (nothing to do without coda);
2. reads the running Slurm's version from ``slurmctld -V``;
3. finds job_submit_coda.so as slurmctld would (the first ``PluginDir`` entry that has
   it) and reads its ``plugin_version`` and libpython (:mod:`slurm_plugin.hook.elf`);
4. when it is not built for this Slurm and this system's Python (or is the passthrough,
   or is missing), rebuilds it from the plugin's source against Slurm's headers, when
   they are this Slurm's and a compiler, Python's headers and cffi are there;
5. when it cannot rebuild, installs the passthrough (csrc/job_submit_coda_passthrough.c:
   accepts every job unchanged) with this Slurm's version written into it, and says
   loudly, in the journal and in slurmctld's log, what was missing and how to fix it.

Every file is replaced by rename (:func:`slurm_plugin.hook.install.install_plugin`);
when nothing can be installed the old file stays as it was.  Expected problems never
raise: each outcome is a :class:`GuardResult` with the lines the CLI prints.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurm_keys
from slurm_plugin.hook import elf
from slurm_plugin.hook.install import PLUGIN_FILE, find_system_plugin_dir, install_plugin

PREFIX = "coda-slurm plugin guard"
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
DEFAULT_SLURMCTLD = Path("/usr/sbin/slurmctld")
DEFAULT_INCLUDE = "/usr/include:/usr/local/include"
"""Where Slurm's headers are looked for unless ``CODA_SLURM_INCLUDE`` says (as
csrc/build_plugin.py does)."""
PACKAGE_SOURCE_DIR = Path("/usr/share/coda-slurm/plugin-src")
"""Where the Debian and RPM packages install build_plugin.py and the plugin's C sources."""
PACKAGE_PASSTHROUGH = Path("/usr/lib/coda-slurm/job_submit_coda_passthrough.so")
"""The passthrough the Debian and RPM packages ship, built with the package."""
PASSTHROUGH_FILE = "job_submit_coda_passthrough.so"
RPM_PACKAGE_NAMES = {"libslurm-dev": "slurm-devel", "python3-dev": "python3-devel"}
"""The RHEL family's names for the Debian packages a rebuild needs (SchedMD's slurm.spec,
the distribution's Python; OpenHPC's is slurm-devel-ohpc); gcc, python3-cffi and coda-slurm
are named alike."""
OS_RELEASE = Path("/etc/os-release")
BUILD_TIMEOUT_S = 300.0
VERSION_TIMEOUT_S = 30.0
FIX_STEP = "then run `coda-slurm plugin guard` and restart slurmctld"

SlurmVersion = tuple[int, int, int]
Outcome = Literal["disabled", "good", "stale", "rebuilt", "passthrough", "unchanged", "error"]
GOOD_OUTCOMES = frozenset({"disabled", "good", "rebuilt"})


# -- pure parts ------------------------------------------------------------------------


def version_number(version: SlurmVersion) -> int:
    """Slurm's ``SLURM_VERSION_NUMBER`` (0xMMmmuu): (22, 5, 8) -> 0x160508."""
    major, minor, micro = version
    return (major << 16) | (minor << 8) | micro


def version_of_number(number: int) -> SlurmVersion:
    return (number >> 16) & 0xFF, (number >> 8) & 0xFF, number & 0xFF


def format_version(version: SlurmVersion) -> str:
    return f"{version[0]}.{version[1]:02d}.{version[2]}"


_VERSION = re.compile(r"\b(\d+)\.(\d+)\.(\d+)")


def parse_slurmctld_version(text: str) -> SlurmVersion:
    """The release ``slurmctld -V`` prints: ``slurm-wlm 22.05.8`` -> (22, 5, 8)."""
    m = _VERSION.search(text)
    if m is None:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    major, minor, micro = (int(g) for g in m.groups())
    if max(major, minor, micro) > 0xFF:
        raise ValueError(f"{m.group()} does not fit SLURM_VERSION_NUMBER")
    return major, minor, micro


def names_coda(job_submit_plugins: str | None) -> bool:
    """Whether ``JobSubmitPlugins`` loads job_submit/coda (``lua,coda``, ``job_submit/coda``)."""
    items = (p.strip() for p in (job_submit_plugins or "").split(","))
    return any(p.removeprefix("job_submit/") == "coda" for p in items)


def python_of(soname: str | None) -> str | None:
    """``3.11`` from ``libpython3.11.so.1.0``."""
    m = re.match(r"libpython(\d+\.\d+)", soname or "")
    return m.group(1) if m else None


def rpm_family(os_release: str) -> bool:
    """Whether ``/etc/os-release`` (its text) is a RHEL-family or Fedora system's: ``ID`` or
    ``ID_LIKE`` names rhel, centos or fedora (Rocky, Alma and RHEL itself do)."""
    ids: set[str] = set()
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip("\"'").lower().split())
    return bool(ids & {"rhel", "centos", "fedora"})


@functools.cache
def _host_rpm_family() -> bool:
    try:
        return rpm_family(OS_RELEASE.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False


def package_name(debian: str, rpm: bool | None = None) -> str:
    """What to install for ``debian`` (Debian's package name) on this host, or on an RPM
    system when ``rpm`` says so: the RHEL family's name where it differs."""
    if rpm is None:
        rpm = _host_rpm_family()
    return RPM_PACKAGE_NAMES.get(debian, debian) if rpm else debian


def header_version(include_dirs: Sequence[Path]) -> tuple[Path, SlurmVersion] | None:
    """The first include directory with ``slurm/slurm_version.h`` and the version it
    says; None when none has one that says it."""
    for d in include_dirs:
        try:
            text = (d / "slurm" / "slurm_version.h").read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"^#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", text, re.M)
        if m is not None:
            return d, version_of_number(int(m.group(1), 16))
    return None


# -- what is there ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginFile:
    """What the guard read from a job_submit_coda.so."""

    path: Path
    version: SlurmVersion | None = None
    libpython: str | None = None
    """The libpython it embeds (DT_NEEDED); None for the passthrough."""
    passthrough: bool = False
    unreadable: str | None = None
    """Why it could not be read as a plugin; None when it could."""


def read_plugin(path: Path) -> PluginFile:
    try:
        data = path.read_bytes()
        so = elf.parse(data)
        version = version_of_number(so.u32(data, "plugin_version"))
    except (OSError, elf.NotASharedObject) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return PluginFile(path, unreadable=why)
    libpython = next((n for n in so.needed if n.startswith("libpython")), None)
    return PluginFile(path, version, libpython, "coda_passthrough" in so.symbols)


@dataclass(frozen=True, slots=True)
class Missing:
    """One thing a rebuild needs and does not have."""

    what: str
    package: str | None
    """The package that brings it on this host (:func:`package_name`); None when no package
    does."""


@dataclass(frozen=True, slots=True)
class GuardResult:
    outcome: Outcome
    lines: tuple[str, ...]
    slurm_conf: Path
    slurmctld_version: SlurmVersion | None = None
    plugin: PluginFile | None = None
    installed: Path | None = None
    missing: tuple[Missing, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Whether slurmctld will load the real job_submit/coda (or none is configured)."""
        return self.outcome in GOOD_OUTCOMES

    def as_json(self) -> dict[str, object]:
        plugin = self.plugin
        return {
            "outcome": self.outcome,
            "ok": self.ok,
            "slurm_conf": str(self.slurm_conf),
            "slurmctld_version": (
                format_version(self.slurmctld_version) if self.slurmctld_version else None
            ),
            "plugin": str(plugin.path) if plugin else None,
            "plugin_version": format_version(plugin.version) if plugin and plugin.version else None,
            "plugin_libpython": plugin.libpython if plugin else None,
            "plugin_passthrough": plugin.passthrough if plugin else None,
            "installed": str(self.installed) if self.installed else None,
            "missing": [{"what": m.what, "package": m.package} for m in self.missing],
            "lines": list(self.lines),
        }


def _say(text: str) -> str:
    return f"{PREFIX}: {text}"


def _slurmctld_version(slurmctld: Path) -> SlurmVersion:
    """Raises OSError, subprocess.SubprocessError or ValueError."""
    proc = subprocess.run(
        [str(slurmctld), "-V"],
        capture_output=True,
        text=True,
        timeout=VERSION_TIMEOUT_S,
        check=False,
    )
    return parse_slurmctld_version(proc.stdout or proc.stderr)


def default_slurmctld() -> Path:
    found = shutil.which("slurmctld")
    return Path(found) if found else DEFAULT_SLURMCTLD


def default_source_dirs() -> tuple[Path, ...]:
    """The Debian package's copy of the plugin's source, then a checkout's ``csrc/``."""
    import slurm_plugin

    return PACKAGE_SOURCE_DIR, Path(slurm_plugin.__file__).resolve().parent.parent / "csrc"


def default_passthroughs() -> tuple[Path, ...]:
    import slurm_plugin

    return PACKAGE_PASSTHROUGH, Path(slurm_plugin.__file__).resolve().parent / PASSTHROUGH_FILE


def _find_plugin(plugin_dirs: Sequence[Path]) -> Path | None:
    # As slurmctld does: the first PluginDir entry that has the file.
    return next((d / PLUGIN_FILE for d in plugin_dirs if (d / PLUGIN_FILE).is_file()), None)


def _problem(plugin: PluginFile, running: SlurmVersion, libpython: str) -> str | None:
    """Why slurmctld ``running`` would not run the real plugin; None when it would."""
    if plugin.unreadable:
        return f"{plugin.path} cannot be read as a plugin ({plugin.unreadable})"
    if plugin.passthrough:
        return f"{plugin.path} is the passthrough (jobs are not changed by coda)"
    assert plugin.version is not None
    if plugin.version != running:
        return (
            f"{plugin.path.name} was built for Slurm {format_version(plugin.version)}, "
            f"slurmctld is {format_version(running)}"
        )
    if plugin.libpython != libpython:
        return (
            f"{plugin.path.name} embeds Python {python_of(plugin.libpython) or '?'} "
            f"({plugin.libpython or 'no libpython'}), {sys.executable} is Python "
            f"{python_of(libpython) or '?'} ({libpython})"
        )
    return None


def _include_dirs(environ: Mapping[str, str]) -> tuple[Path, ...]:
    value = environ.get("CODA_SLURM_INCLUDE", DEFAULT_INCLUDE)
    return tuple(Path(d) for d in value.split(":") if d)


def _compiler() -> str:
    return (sysconfig.get_config_var("CC") or "cc").split()[0]


def _source_dir(candidates: Sequence[Path], *files: str) -> Path | None:
    return next((d for d in candidates if all((d / f).is_file() for f in files)), None)


def _build_missing(
    running: SlurmVersion, include_dirs: Sequence[Path], source_dir: Path | None
) -> list[Missing]:
    """What a rebuild for slurmctld ``running`` lacks (empty: it can be tried)."""
    missing: list[Missing] = []
    found = header_version(include_dirs)
    dirs = ", ".join(str(d) for d in include_dirs) or "(none)"
    if found is None:
        missing.append(
            Missing(
                f"Slurm's headers (no slurm/slurm_version.h in {dirs})",
                package_name("libslurm-dev"),
            )
        )
    elif found[1] != running:
        missing.append(
            Missing(
                f"Slurm {format_version(running)}'s headers ({found[0]} has "
                f"{format_version(found[1])}'s)",
                package_name("libslurm-dev"),
            )
        )
    cc = _compiler()
    if shutil.which(cc) is None:
        missing.append(Missing(f"a C compiler ({cc})", "gcc"))
    include = Path(sysconfig.get_paths()["include"])
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "/") / (
        sysconfig.get_config_var("LDLIBRARY") or "libpython.so"
    )
    if not (include / "Python.h").is_file() or not libpython.exists():
        missing.append(
            Missing(
                f"Python's headers and {libpython.name} ({include}/Python.h)",
                package_name("python3-dev"),
            )
        )
    if importlib.util.find_spec("cffi") is None:
        missing.append(Missing(f"cffi for {sys.executable}", "python3-cffi"))
    if source_dir is None:
        missing.append(
            Missing("the plugin's source (build_plugin.py, job_submit_coda.c)", "coda-slurm")
        )
    return missing


def _run_build(
    script: Path, out_dir: Path, environ: Mapping[str, str], *args: str
) -> tuple[Path | None, str]:
    """Run ``build_plugin.py`` in a subprocess: (the built file or None, its last words)."""
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *args, str(out_dir)],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"the build ran over {BUILD_TIMEOUT_S:g} s"
    except OSError as exc:
        return None, f"cannot run {sys.executable} ({exc.strerror or exc})"
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        return None, f"the build exited {proc.returncode}: {tail}"
    built = Path(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    if built is None or not built.is_file():
        return None, "the build named no file"
    return built, tail


def _fix(missing: Sequence[Missing]) -> str:
    packages = list(dict.fromkeys(m.package for m in missing if m.package))
    if packages:
        return f"Fix: install {', '.join(packages)}, {FIX_STEP}"
    return f"Fix: see the build's error above, {FIX_STEP}"


# -- the guard -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Context:
    slurm_conf: Path
    running: SlurmVersion
    plugin: PluginFile | None
    target_dir: Path
    libpython: str
    environ: Mapping[str, str]
    source_dirs: tuple[Path, ...]
    passthroughs: tuple[Path, ...]


def _plugin_dirs(conf: Path) -> tuple[Path, ...] | GuardResult:
    """Where slurmctld loads plugins from, per slurm.conf (else Slurm's own directory);
    or the result to return when coda is not configured or that cannot be told."""
    try:
        keys = read_slurm_keys(conf, ("JobSubmitPlugins", "PluginDir"))
    except ConfigError as exc:
        line = _say(f"error: cannot read {conf} ({exc}): nothing changed")
        return GuardResult("error", (line,), conf)
    if not names_coda(keys.get("jobsubmitplugins")):
        line = _say(f"JobSubmitPlugins in {conf} does not name coda: nothing to do")
        return GuardResult("disabled", (line,), conf)
    plugin_dirs = tuple(Path(d) for d in keys.get("plugindir", "").split(":") if d)
    if plugin_dirs:
        return plugin_dirs
    system_dir = find_system_plugin_dir()
    if system_dir is None:
        line = _say(
            f"error: {conf} sets no PluginDir and Slurm's plugin directory was not "
            "found: nothing changed"
        )
        return GuardResult("error", (line,), conf)
    return (system_dir,)


def guard(
    slurm_conf: Path | None = None,
    slurmctld: Path | None = None,
    source: Path | None = None,
    passthrough: Path | None = None,
    *,
    change: bool = True,
    environ: Mapping[str, str] | None = None,
) -> GuardResult:
    """Make job_submit/coda loadable by the slurmctld about to start (``change=False``:
    only say whether it is).  Never raises for a problem it can name."""
    environ = os.environ if environ is None else environ
    conf = slurm_conf or Path(environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    plugin_dirs = _plugin_dirs(conf)
    if isinstance(plugin_dirs, GuardResult):
        return plugin_dirs
    slurmctld = slurmctld or default_slurmctld()
    try:
        running = _slurmctld_version(slurmctld)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        line = _say(f"error: cannot tell the version of {slurmctld} ({why}): nothing changed")
        return GuardResult("error", (line,), conf)

    found = _find_plugin(plugin_dirs)
    plugin = read_plugin(found) if found else None
    libpython = sysconfig.get_config_var("INSTSONAME") or ""
    if plugin is None:
        problem = f"no {PLUGIN_FILE} in PluginDir {':'.join(str(d) for d in plugin_dirs)}"
    elif (problem := _problem(plugin, running, libpython)) is None:
        assert plugin.version is not None
        line = _say(
            f"job_submit/coda built for Slurm {format_version(plugin.version)} "
            f"(Python {python_of(plugin.libpython)}) matches slurmctld {format_version(running)}"
        )
        return GuardResult("good", (line,), conf, running, plugin)
    ctx = _Context(
        slurm_conf=conf,
        running=running,
        plugin=plugin,
        target_dir=found.parent if found else plugin_dirs[0],
        libpython=libpython,
        environ=environ,
        source_dirs=(source,) if source else default_source_dirs(),
        passthroughs=(passthrough,) if passthrough else default_passthroughs(),
    )
    if not change:
        return _say_stale(ctx, problem)
    with tempfile.TemporaryDirectory(prefix="coda-plugin-guard.") as tmp:
        return _repair(ctx, problem, Path(tmp))


def _say_stale(ctx: _Context, problem: str) -> GuardResult:
    """What ``guard`` would do, without doing it."""
    source_dir = _source_dir(ctx.source_dirs, "build_plugin.py", "job_submit_coda.c")
    missing = _build_missing(ctx.running, _include_dirs(ctx.environ), source_dir)
    if missing:
        lacking = "; ".join(m.what for m in missing)
        line = _say(
            f"error: {problem}; job_submit/coda cannot be rebuilt for slurmctld "
            f"{format_version(ctx.running)} (missing: {lacking}). {_fix(missing)}"
        )
    else:
        line = _say(f"{problem}: `coda-slurm plugin guard` rebuilds it from {source_dir}")
    return GuardResult(
        "stale", (line,), ctx.slurm_conf, ctx.running, ctx.plugin, None, tuple(missing)
    )


def _repair(ctx: _Context, problem: str, tmp: Path) -> GuardResult:
    include_dirs = _include_dirs(ctx.environ)
    source_dir = _source_dir(ctx.source_dirs, "build_plugin.py", "job_submit_coda.c")
    missing = _build_missing(ctx.running, include_dirs, source_dir)
    notes: list[str] = []
    if not missing:
        assert source_dir is not None
        built, said = _run_build(source_dir / "build_plugin.py", tmp / "build", ctx.environ)
        got = read_plugin(built) if built else None
        if got is not None and (got.unreadable or got.passthrough):
            said = f"the build made {built}, which is no plugin ({got.unreadable})"
        elif got is not None and _problem(got, ctx.running, ctx.libpython) is not None:
            said = f"the build is not right: {_problem(got, ctx.running, ctx.libpython)}"
        elif got is not None:
            try:
                dest = install_plugin(ctx.target_dir, source=built)
            except OSError as exc:
                line = _say(
                    f"error: {problem}: rebuilt, but cannot install into {ctx.target_dir} "
                    f"({exc.strerror or exc}): left as it was"
                )
                return GuardResult("unchanged", (line,), ctx.slurm_conf, ctx.running, ctx.plugin)
            found = header_version(include_dirs)
            against = f"{found[0]} ({format_version(found[1])})" if found else "?"
            line = _say(
                f"{problem}: rebuilt against {against} for Python "
                f"{python_of(ctx.libpython)} -> {dest}"
            )
            return GuardResult("rebuilt", (line,), ctx.slurm_conf, ctx.running, got, dest)
        missing = [Missing(f"a build that succeeds ({said})", None)]
        notes.append(_say(f"building from {source_dir} failed: {said}"))
    return _install_passthrough(ctx, problem, missing, notes, tmp)


def _passthrough_template(ctx: _Context, tmp: Path) -> tuple[Path | None, str]:
    """A passthrough to patch: a shipped one, else one compiled now; or why there is none."""
    for path in ctx.passthroughs:
        if path.is_file():
            return path, ""
    looked = ", ".join(str(p) for p in ctx.passthroughs)
    source_dir = _source_dir(ctx.source_dirs, "build_plugin.py", "job_submit_coda_passthrough.c")
    if source_dir is None or shutil.which(_compiler()) is None:
        return None, f"no passthrough in {looked}, and none can be compiled"
    built, said = _run_build(
        source_dir / "build_plugin.py", tmp / "passthrough", ctx.environ, "--passthrough"
    )
    if built is None:
        return None, f"no passthrough in {looked}, and compiling one failed: {said}"
    return built, ""


def _patched_passthrough(ctx: _Context, tmp: Path, reason: str) -> tuple[bytes | None, str]:
    """A passthrough's bytes, marked for the running Slurm and carrying ``reason`` for
    slurmctld's log; or why there is none."""
    template, why_none = _passthrough_template(ctx, tmp)
    if template is None:
        return None, why_none
    try:
        data = template.read_bytes()
        so = elf.parse(data)
        if "coda_passthrough" not in so.symbols:
            raise elf.NotASharedObject("not the coda passthrough")
        patched = so.with_u32(data, "plugin_version", version_number(ctx.running))
        patched = so.with_text(patched, "coda_bypass_reason", reason)
    except (OSError, elf.NotASharedObject) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, f"{template} cannot be used ({why})"
    return patched, why_none


def _install_passthrough(
    ctx: _Context, problem: str, missing: Sequence[Missing], notes: list[str], tmp: Path
) -> GuardResult:
    running = format_version(ctx.running)
    lacking = "; ".join(m.what for m in missing)
    fix = _fix(missing)
    reason = (
        f"coda is bypassed: the real plugin could not be built for Slurm {running} "
        f"(missing: {lacking}); jobs are not changed by coda. {fix}"
    )
    patched, why_none = _patched_passthrough(ctx, tmp, reason)
    head = f"error: {problem}; job_submit/coda cannot be rebuilt for slurmctld {running}"

    def unchanged(why_not: str) -> GuardResult:
        line = _say(f"{head} (missing: {lacking}){why_not}: left as it was. {fix}")
        return GuardResult(
            "unchanged",
            (*notes, line),
            ctx.slurm_conf,
            ctx.running,
            ctx.plugin,
            None,
            tuple(missing),
        )

    if patched is None:
        return unchanged(f" and {why_none}")
    dest = ctx.target_dir / PLUGIN_FILE
    done = "kept the passthrough"
    try:
        if not (dest.is_file() and dest.read_bytes() == patched):
            staged = tmp / PLUGIN_FILE
            staged.write_bytes(patched)
            dest = install_plugin(ctx.target_dir, source=staged)
            done = "installed the passthrough"
    except OSError as exc:
        return unchanged(
            f", and the passthrough cannot be installed into {ctx.target_dir} "
            f"({exc.strerror or exc})"
        )
    line = _say(
        f"{head} (missing: {lacking}): {done} -> {dest}; slurmctld "
        f"starts and jobs are not changed by coda. {fix}"
    )
    return GuardResult(
        "passthrough",
        (*notes, line),
        ctx.slurm_conf,
        ctx.running,
        read_plugin(dest),
        dest,
        tuple(missing),
    )
