"""The compiled plugin (job_submit_coda's cffi module) in this process, without slurmctld.

``slurm_plugin._job_submit`` is the same build as job_submit_coda.so.  It needs a few
functions slurmctld exports (``slurm_info``, ``slurm_xstrdup``, ...); :func:`load` compiles
a stand-in for them with ``cc`` and loads it with global symbol scope first, as slurmctld's
own symbols are.  The stand-in writes each log line to the file named by
``CODA_STANDIN_LOG`` ("LEVEL text"), or nowhere when it is unset.

Used by tests/controller/test_hook_compiled.py and bench/bench_hook_inprocess.py.  The plugin's own
``init()``/``job_submit()``/``fini()`` are called as slurmctld calls them; ``init()`` runs
inside this interpreter (it finds Python already started).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurm_plugin.hook import submit as hook

STANDIN_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void out(const char *level, const char *fmt, va_list ap)
{
	const char *path = getenv("CODA_STANDIN_LOG");
	FILE *f;

	if (!path || !*path)
		return;
	f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, "%s ", level);
	vfprintf(f, fmt, ap);
	fputc('\n', f);
	fclose(f);
}
void slurm_xfree(void **item) { free(*item); *item = NULL; }
char *slurm_xstrdup(const char *s) { return s ? strdup(s) : NULL; }
#define LOGGER(name, level) \
	void name(const char *f, ...) \
	{ \
		va_list ap; \
		va_start(ap, f); \
		out(level, f, ap); \
		va_end(ap); \
	}
LOGGER(slurm_error, "error")
LOGGER(slurm_info, "info")
LOGGER(slurm_verbose, "verbose")
LOGGER(slurm_debug, "debug")
"""


class Unavailable(RuntimeError):
    """No C compiler, or the plugin module was not built."""


def load(build_dir: Path) -> tuple[Any, Any]:
    """(ffi, lib) of the compiled plugin module, with the slurmctld stand-in loaded."""
    cc = shutil.which("cc")
    if cc is None:
        raise Unavailable("no C compiler (cc) to build the slurmctld stand-in")
    digest = hashlib.sha256(STANDIN_C.encode()).hexdigest()[:12]
    standin = build_dir / f"slurmctld_standin_{digest}.so"
    if not standin.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / f"standin_{digest}.c"
        source.write_text(STANDIN_C)
        tmp = standin.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(source)], check=True)
        os.replace(tmp, standin)
    ctypes.CDLL(str(standin), mode=os.RTLD_GLOBAL)
    try:
        from slurm_plugin._job_submit import ffi, lib
    except ImportError as exc:
        module = _installed_plugin_module()
        if module is None:
            raise Unavailable(f"the compiled plugin module is not built ({exc})") from exc
        ffi, lib = module.ffi, module.lib
    return ffi, lib


def _installed_plugin_module() -> Any:
    """The plugin a Debian package installed (job_submit_coda.so in Slurm's PluginDir, the
    same module under slurmctld's file name), imported as ``slurm_plugin._job_submit``."""
    from slurm_plugin.hook.install import PluginNotBuilt, built_plugin

    try:
        path = built_plugin()
    except PluginNotBuilt:
        return None
    name = "slurm_plugin._job_submit"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def start(ffi: Any, lib: Any) -> None:
    """The plugin's ``init()``, as slurmctld calls it (coda.conf from ``$CODA_CONF``)."""
    # The embedding init code binds the hook only on the module's first start; tests in
    # this process may have bound it to a double since.
    hook.bind(ffi, lib)
    saved = sys.stderr  # init() captures stderr while Python starts, then restores it
    try:
        lib.init()
    finally:
        sys.stderr = saved
    if hook.current_state() is None:
        raise RuntimeError("job_submit/coda did not start (see CODA_STANDIN_LOG)")


def new_desc(ffi: Any, lib: Any, **fields: Any) -> Any:
    """A job_desc_msg_t as sbatch sends it: unset numbers NO_VAL, the strings given.

    The strings are allocated as slurmctld's are (the stand-in's ``slurm_xstrdup``), since
    the plugin frees the ones it replaces; they are not freed afterwards (a test leaks a
    few bytes per job)."""
    desc = ffi.new("job_desc_msg_t *")
    desc.cpus_per_task = lib.NO_VAL16
    desc.min_nodes = desc.max_nodes = desc.num_tasks = desc.min_cpus = lib.NO_VAL
    desc.ntasks_per_node = desc.pn_min_cpus = desc.sockets_per_node = lib.NO_VAL16
    lib.coda_set_job_id(desc, lib.NO_VAL)
    desc.user_id = 1000
    for name, value in fields.items():
        if name == "job_id":  # step_id.job_id from Slurm 25.11 on
            lib.coda_set_job_id(desc, value)
        elif isinstance(value, str):
            lib.coda_replace_str(
                ffi.addressof(desc, name), value.encode("utf-8", "surrogateescape")
            )
        else:
            setattr(desc, name, value)
    return desc


def new_err(ffi: Any, lib: Any, text: str | None = None) -> Any:
    """The ``char **err_msg`` slurmctld passes: NULL, or what an earlier plugin said."""
    err = ffi.new("char **")
    if text is not None:
        lib.coda_replace_str(err, text.encode())
    return err
