"""cffi build script for job_submit_coda.so, the embedded-Python Slurm plugin.

setup.py names this in ``cffi_modules``; it can also be run by hand::

    python csrc/build_plugin.py OUTDIR
    python csrc/build_plugin.py --passthrough OUTDIR

The second form builds ``job_submit_coda_passthrough.so`` from
``job_submit_coda_passthrough.c``: a plugin that accepts every job unchanged, built without
Slurm's headers or cffi, which ``coda-slurm plugin guard`` installs when the real plugin
cannot be built for the Slurm about to start.  Nothing here reads the Slurm headers or
imports cffi until the real plugin is built: ``ffibuilder`` is the function cffi's
``cffi_modules`` calls for the FFI.

The module is built in cffi's *embedding* mode: the shared object starts its own
interpreter (the Python this script runs on, e.g. Debian's libpython3.11) inside slurmctld
and runs ``slurm_plugin.hook.submit``.  Only the fields of ``job_desc_msg_t`` the hook reads or
writes are declared; the ``...;`` lets cffi take their offsets from Slurm's own
``slurm/slurm.h`` at compile time, so the build follows the Slurm headers installed, and
a field that moved is a compile error, never a wrong offset.  The same holds for the fields
of ``slurm_job_info_t`` the re-decision of an updated pending job reads
(``slurm_plugin/hook/modify.py``), loaded with libslurm's ``slurm_load_job``.

The Slurm release is read from ``slurm/slurm_version.h`` (:data:`TESTED_RELEASES` are the
ones the test suite runs against); the declaration follows it: Slurm 25.11 moved the job
id into ``step_id.job_id``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import cffi

HERE = Path(__file__).resolve().parent
MODULE_NAME = "slurm_plugin._job_submit"
PASSTHROUGH_SOURCE = HERE / "job_submit_coda_passthrough.c"
PASSTHROUGH_FILE = "job_submit_coda_passthrough.so"

TESTED_RELEASES = ((22, 5), (24, 11), (26, 5))
"""Slurm releases (major, minor) the version matrix of the test suite builds and runs."""
STEP_ID_RELEASE = (25, 11)
"""From this release on ``job_desc_msg_t`` has ``slurm_step_id_t step_id`` for ``job_id``."""
INCLUDE_DIRS = tuple(
    Path(d)
    for d in os.environ.get("CODA_SLURM_INCLUDE", "/usr/include:/usr/local/include").split(":")
    if d
)


class SlurmHeadersMissing(RuntimeError):
    """No ``slurm/slurm_version.h`` where the build looks."""


def slurm_version(include_dirs: tuple[Path, ...] = INCLUDE_DIRS) -> tuple[int, int, int]:
    """``(major, minor, micro)`` of the Slurm whose headers the plugin is built against."""
    for d in include_dirs:
        header = d / "slurm" / "slurm_version.h"
        try:
            text = header.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            continue
        m = re.search(r"^#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", text, re.M)
        if m is None:
            raise SlurmHeadersMissing(f"{header} has no SLURM_VERSION_NUMBER")
        n = int(m.group(1), 16)
        return (n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF
    dirs = ", ".join(str(d) for d in include_dirs)
    raise SlurmHeadersMissing(
        f"slurm/slurm_version.h not found in {dirs}: install Slurm's development headers "
        "(Debian: libslurm-dev) of the Slurm this plugin will run in"
    )


def _slurm_include_dirs() -> list[str]:
    """``-I`` directories that make the compiler read the Slurm headers whose version
    :func:`slurm_version` read: the first with ``slurm/slurm_version.h``, unless it is
    the compiler's own ``/usr/include`` (naming that with -I reorders system headers)."""
    for d in INCLUDE_DIRS:
        if (d / "slurm" / "slurm_version.h").is_file():
            return [] if d == Path("/usr/include") else [str(d)]
    return []


def job_id_cdef(version: tuple[int, int, int]) -> str:
    """The declaration of the job id field for this release."""
    if version[:2] >= STEP_ID_RELEASE:
        return "slurm_step_id_t step_id;"
    return "uint32_t job_id;"


STEP_ID_CDEF = r"""
typedef struct {
    uint32_t job_id;
    ...;
} slurm_step_id_t;
"""

CDEF = r"""
#define SLURM_VERSION_NUMBER ...
#define NO_VAL ...
#define NO_VAL16 ...
#define SLURM_SUCCESS ...
#define SLURM_ERROR ...

typedef struct job_descriptor {
    char *admin_comment;
    char *comment;
    char *cpus_per_tres;
    uint16_t cpus_per_task;
    @JOB_ID@
    char *job_id_str;
    uint32_t max_nodes;
    uint32_t min_cpus;
    uint32_t min_nodes;
    char *name;
    uint32_t num_tasks;
    uint16_t ntasks_per_node;
    char *partition;
    uint16_t pn_min_cpus;
    uint16_t sockets_per_node;
    char *prefer;
    char *script;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_socket;
    char *tres_per_task;
    uint32_t user_id;
    ...;
} job_desc_msg_t;

typedef struct job_info {
    char *admin_comment;
    uint32_t array_job_id;
    char *comment;
    uint16_t cpus_per_task;
    char *cpus_per_tres;
    uint32_t het_job_id;
    uint32_t job_state;
    char *name;
    uint16_t ntasks_per_node;
    uint32_t num_nodes;
    uint32_t num_tasks;
    char *partition;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_socket;
    char *tres_per_task;
    uint32_t user_id;
    ...;
} slurm_job_info_t;

typedef struct job_info_msg {
    uint32_t record_count;
    slurm_job_info_t *job_array;
    ...;
} job_info_msg_t;

static void coda_log(int level, const char *msg);
static void coda_replace_str(char **slot, const char *value);
static uint32_t coda_job_id(const job_desc_msg_t *d);
static void coda_set_job_id(job_desc_msg_t *d, uint32_t job_id);
static void coda_set_cpus_per_task(job_desc_msg_t *d, uint16_t now);
static void coda_rescale_min_cpus(job_desc_msg_t *d, uint32_t was, uint32_t now);
static uint64_t coda_next_token(void);
static int coda_job_load(uint32_t job_id, job_info_msg_t **out);
static void coda_job_free(job_info_msg_t *msg);
static int coda_job_update(uint32_t job_id, const char *cpus_per_tres,
                           const char *admin_comment, uint32_t min_cpus);
static const char *coda_strerror(int rc);

/* The plugin's own entry points, as slurmctld calls them (for in-process tests and
   bench/bench_hook_inprocess.py; slurmctld itself finds them with dlsym). */
int init(void);
int fini(void);
int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg);
"""

EMBEDDING_API = r"""
int coda_py_init(void);
void coda_py_fini(void);
int coda_py_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg);
int coda_py_modify(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg);
"""

# Runs inside slurmctld once cffi has created the module: import the hook and
# register the four entry points.  Any exception here is captured and logged by
# coda_start() in job_submit_coda.c.
EMBEDDING_INIT_CODE = r"""
from slurm_plugin._job_submit import ffi, lib
from slurm_plugin.hook import submit as _hook

_hook.bind(ffi, lib)

@ffi.def_extern(onerror=_hook.on_callback_error)
def coda_py_init():
    return _hook.plugin_init()

@ffi.def_extern(onerror=_hook.on_callback_error)
def coda_py_fini():
    _hook.plugin_fini()

@ffi.def_extern(onerror=_hook.on_callback_error)
def coda_py_submit(job_desc, submit_uid, err_msg):
    return _hook.job_submit(job_desc, submit_uid, err_msg)

@ffi.def_extern(onerror=_hook.on_callback_error)
def coda_py_modify(job_desc, submit_uid, err_msg):
    return _hook.job_modify(job_desc, submit_uid, err_msg)
"""


def _site_dirs() -> list[str]:
    """Where this interpreter installs packages: the embedded interpreter adds them."""
    paths = sysconfig.get_paths()
    dirs: list[str] = []
    for key in ("purelib", "platlib"):
        if paths[key] not in dirs:
            dirs.append(paths[key])
    return dirs


def _c_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bootstrap_code() -> str:
    # Executed in __main__ before cffi imports anything: make the install's
    # site-packages (a virtualenv's, typically) importable, honour
    # CODA_PYTHON_SITE for admins who move things, and capture stderr.
    site_dirs = _site_dirs()
    return "\n".join(
        [
            "import io, os, site, sys",
            f"for _d in {site_dirs!r} + [p for p in "
            "os.environ.get('CODA_PYTHON_SITE', '').split(':') if p]:",
            "    site.addsitedir(_d)",
            "_coda_captured = io.StringIO()",
            "sys.stderr = _coda_captured",
            "def _coda_restore_stderr():",
            "    sys.stderr = sys.__stderr__",
            "    return _coda_captured.getvalue()",
            "",
        ]
    )


def describe(version: tuple[int, int, int]) -> str:
    """One line on the release the plugin is built for, and whether it is tested."""
    release = f"{version[0]}.{version[1]:02d}"
    tested = ", ".join(f"{a}.{b:02d}" for a, b in TESTED_RELEASES)
    if version[:2] in TESTED_RELEASES:
        return f"job_submit_coda: building for Slurm {release}.{version[2]} (tested: {tested})"
    return (
        f"job_submit_coda: building for Slurm {release}.{version[2]}, which the test suite "
        f"does not cover (tested: {tested}); every job_desc field the plugin uses is still "
        "checked against this slurm.h"
    )


def make_builder(version: tuple[int, int, int] | None = None) -> cffi.FFI:
    import cffi

    version = version or slurm_version()
    sys.stderr.write(describe(version) + "\n")
    cdef = CDEF.replace("@JOB_ID@", job_id_cdef(version))
    if version[:2] >= STEP_ID_RELEASE:
        cdef = STEP_ID_CDEF + cdef
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef)
    ffibuilder.embedding_api(EMBEDDING_API)
    ffibuilder.embedding_init_code(EMBEDDING_INIT_CODE)
    libpython = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    bootstrap = _bootstrap_code()
    prelude = "\n".join(
        [
            f"#define CODA_LIBPYTHON {_c_string(libpython)}",
            "#define CODA_BOOTSTRAP " + _c_string(bootstrap).replace("\n", "\\n"),
            # Prototypes of the functions cffi generates from EMBEDDING_API.
            "int coda_py_init(void);",
            "void coda_py_fini(void);",
            "int coda_py_submit(job_desc_msg_t *, uint32_t, char **);",
            "int coda_py_modify(job_desc_msg_t *, uint32_t, char **);",
            "",
        ]
    )
    source = (HERE / "job_submit_coda.c").read_text()
    ffibuilder.set_source(
        MODULE_NAME,
        source.replace("/* @CODA_PRELUDE@ */", prelude),
        # Link libpython explicitly: slurmctld has no Python of its own. (cffi's
        # setuptools integration would otherwise build an abi3 extension that
        # expects the host process to provide the Python symbols.)
        include_dirs=_slurm_include_dirs(),
        libraries=["dl", "python" + sysconfig.get_config_var("LDVERSION")],
        library_dirs=[sysconfig.get_config_var("LIBDIR")],
        py_limited_api=False,
        extra_compile_args=["-Wall", "-Wno-unused-function"],
    )
    return ffibuilder


# cffi's setuptools integration calls a ``cffi_modules`` target that is not an FFI, so the
# headers are read only when setup.py builds the plugin.
ffibuilder = make_builder


def _cc() -> list[str]:
    """The C compiler Python was built with (``x86_64-linux-gnu-gcc`` on Debian)."""
    return (sysconfig.get_config_var("CC") or "cc").split()


def _env_flags(*names: str) -> list[str]:
    """CPPFLAGS, CFLAGS or LDFLAGS from the environment, as setuptools and make take them:
    a Debian build passes dpkg-buildflags' hardening and -g this way."""
    return [flag for name in names for flag in shlex.split(os.environ.get(name, ""))]


def compile_plugin(out_dir: Path) -> Path:
    """Build ``out_dir/job_submit_coda.so`` with the C compiler Python was built with.

    cffi's own ``compile()`` goes through setuptools, which venvs on Python 3.12 and later
    do not have; the plugin needs no more than one compiler call.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = out_dir / "_gen"
    gen.mkdir(exist_ok=True)
    c_file = gen / "job_submit_coda.c"
    with contextlib.redirect_stdout(sys.stderr):  # cffi says "generating ..." on stdout
        make_builder().emit_c_code(str(c_file))
    cc = _cc()
    tmp = out_dir / f".job_submit_coda.so.{os.getpid()}"
    argv = [
        *cc,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wno-unused-function",
        f"-I{sysconfig.get_paths()['include']}",
        *(f"-I{d}" for d in _slurm_include_dirs()),
        *_env_flags("CPPFLAGS", "CFLAGS"),
        str(c_file),
        "-o",
        str(tmp),
        *_env_flags("LDFLAGS"),
        f"-L{sysconfig.get_config_var('LIBDIR')}",
        f"-lpython{sysconfig.get_config_var('LDVERSION')}",
        "-ldl",
    ]
    subprocess.run(argv, check=True)
    final = out_dir / "job_submit_coda.so"
    os.replace(tmp, final)
    return final


def compile_passthrough(out_dir: Path) -> Path:
    """Build ``out_dir/job_submit_coda_passthrough.so``: no Slurm header, no cffi, no
    Python inside; its ``plugin_version`` is a placeholder the guard replaces."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{PASSTHROUGH_FILE}.{os.getpid()}"
    argv = [
        *_cc(),
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        *_env_flags("CPPFLAGS", "CFLAGS"),
        str(PASSTHROUGH_SOURCE),
        "-o",
        str(tmp),
        *_env_flags("LDFLAGS"),
        "-ldl",  # dlsym() lives in libdl before glibc 2.34
    ]
    try:
        subprocess.run(argv, check=True)
        final = out_dir / PASSTHROUGH_FILE
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def main(argv: list[str]) -> int:
    args = argv[1:]
    passthrough = "--passthrough" in args
    if passthrough:
        args.remove("--passthrough")
    out_dir = Path(args[0]) if args else Path.cwd()
    built = compile_passthrough(out_dir) if passthrough else compile_plugin(out_dir)
    sys.stdout.write(f"{built}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
