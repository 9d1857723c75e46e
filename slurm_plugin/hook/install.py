"""Install job_submit_coda.so into a Slurm PluginDir without ever overwriting a loaded copy.

slurmctld mmap()s the plugin; copying a new file over the old inode makes slurmctld
crash (seen as a segfault at exit on 22.05.8). Writing a temporary file beside it and
rename()-ing it replaces the directory entry only: a running slurmctld keeps the old
inode until it restarts.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

PLUGIN_FILE = "job_submit_coda.so"
SLURM_PLUGIN_PROBE = "select_cons_tres.so"
"""A plugin every Slurm install has: the directory that holds it is Slurm's own."""


class PluginNotBuilt(FileNotFoundError):
    """The embedded plugin was not built with this install of the package."""


def plugin_dir_candidates(multiarch: str | None) -> list[Path]:
    """Where distributions put Slurm's plugins: Debian's per-architecture ``slurm-wlm``
    first, then the RPM and source-build layouts (``$libdir/slurm``)."""
    arch = [Path("/usr/lib") / multiarch / d for d in ("slurm-wlm", "slurm")] if multiarch else []
    return [*arch, Path("/usr/lib64/slurm"), Path("/usr/lib/slurm"), Path("/usr/local/lib/slurm")]


def find_system_plugin_dir(candidates: Sequence[Path] | None = None) -> Path | None:
    """Slurm's own plugin directory (its compiled-in ``PluginDir``): the first candidate
    that holds select/cons_tres; None when none does.

    The default candidates follow this Python's architecture (``MULTIARCH``, e.g.
    ``x86_64-linux-gnu``), which is Debian's libslurm's too.
    """
    if candidates is None:
        candidates = plugin_dir_candidates(sysconfig.get_config_var("MULTIARCH"))
    for directory in candidates:
        if (directory / SLURM_PLUGIN_PROBE).is_file():
            return directory
    return None


def built_plugin() -> Path:
    """The job_submit_coda shared object: the one setup.py built beside the package (cffi
    embedding mode), else, on a system where a package installed it, the one in Slurm's
    own plugin directory."""
    here = Path(__file__).resolve().parent.parent
    candidates = sorted(here.glob("_job_submit*.so"))
    if candidates:
        return candidates[0]
    system_dir = find_system_plugin_dir()
    if system_dir is not None and (system_dir / PLUGIN_FILE).is_file():
        return system_dir / PLUGIN_FILE
    raise PluginNotBuilt(
        f"no _job_submit*.so in {here} and no {PLUGIN_FILE} in Slurm's plugin directory "
        f"({system_dir or 'not found'}): reinstall the package (pip install .) on a machine "
        "with libslurm-dev and python3-dev"
    )


def install_plugin(plugin_dir: Path, source: Path | None = None) -> Path:
    """Copy the plugin into ``plugin_dir`` as job_submit_coda.so, atomically."""
    src = source or built_plugin()
    plugin_dir.mkdir(parents=True, exist_ok=True)
    dest = plugin_dir / PLUGIN_FILE
    fd, tmp_name = tempfile.mkstemp(prefix=".job_submit_coda.", dir=plugin_dir)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp_name, 0o755)
        os.replace(tmp_name, dest)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return dest
