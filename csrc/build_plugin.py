"""cffi build script for job_submit_coda.so, the embedded-Python Slurm plugin.

setup.py names this in ``cffi_modules``; it can also be run by hand::

    python csrc/build_plugin.py OUTDIR

The module is built in cffi's *embedding* mode: the shared object starts its own
interpreter (Debian's libpython3.11) inside slurmctld and runs ``slurm_plugin.hook``.
Only the fields of ``job_desc_msg_t`` the hook reads or writes are declared; the
``...;`` lets cffi take their offsets from Slurm's own ``slurm/slurm.h`` at compile
time, so the build follows whatever Slurm headers are installed.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
MODULE_NAME = "slurm_plugin._job_submit"

CDEF = r"""
#define NO_VAL ...
#define NO_VAL16 ...
#define SLURM_SUCCESS ...
#define SLURM_ERROR ...

typedef struct job_descriptor {
    char *admin_comment;
    char *comment;
    char *cpus_per_tres;
    uint16_t cpus_per_task;
    uint32_t job_id;
    uint32_t max_nodes;
    uint32_t min_nodes;
    char *name;
    uint32_t num_tasks;
    uint16_t ntasks_per_node;
    char *partition;
    char *prefer;
    char *script;
    char *tres_per_job;
    char *tres_per_node;
    char *tres_per_socket;
    char *tres_per_task;
    uint32_t user_id;
    ...;
} job_desc_msg_t;

static void coda_log(int level, const char *msg);
static void coda_replace_str(char **slot, const char *value);

/* The replay table (job_submit_coda.c, "Replay"). */
typedef struct {
    int64_t plan_id;
    int64_t unix_ns;
    int64_t elapsed_ns;
    uint32_t job_id;
} coda_replay_t;
static int64_t coda_memo_reset(int enabled, int cpu_jobs_silent);
static int coda_memo_put(job_desc_msg_t *d, uint32_t submit_uid, int64_t gen,
                         int64_t plan_id, int clear_cpus_per_task, int log_level,
                         const char *cpus_per_tres, const char *tres_per_node,
                         const char *prefer, const char *partition,
                         const char *admin_comment, const char *user_msg,
                         const char *log_line);
static int coda_memo_drain(coda_replay_t *out, int max);

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
from slurm_plugin import hook as _hook

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


def make_builder() -> cffi.FFI:
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(CDEF)
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
        libraries=["dl", "python" + sysconfig.get_config_var("LDVERSION")],
        library_dirs=[sysconfig.get_config_var("LIBDIR")],
        py_limited_api=False,
        extra_compile_args=["-Wall", "-Wno-unused-function"],
    )
    return ffibuilder


ffibuilder = make_builder()


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else Path.cwd()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir / "_gen"
    target = ffibuilder.compile(tmpdir=str(tmp_dir), target="job_submit_coda.so", verbose=False)
    final = out_dir / "job_submit_coda.so"
    os.replace(target, final)
    sys.stdout.write(f"{final}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
