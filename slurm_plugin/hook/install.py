"""Install job_submit_coda.so into a Slurm PluginDir without ever overwriting a loaded copy.

slurmctld mmap()s the plugin; copying a new file over the old inode makes slurmctld
crash (seen as a segfault at exit on 22.05.8). Writing a temporary file beside it and
rename()-ing it replaces the directory entry only: a running slurmctld keeps the old
inode until it restarts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PLUGIN_FILE = "job_submit_coda.so"


class PluginNotBuilt(FileNotFoundError):
    """The embedded plugin was not built with this install of the package."""


def built_plugin() -> Path:
    """The job_submit_coda shared object built by setup.py (cffi embedding mode)."""
    here = Path(__file__).resolve().parent.parent
    candidates = sorted(here.glob("_job_submit*.so"))
    if not candidates:
        raise PluginNotBuilt(
            f"no _job_submit*.so in {here}: reinstall the package (pip install .) "
            "on a machine with libslurm-dev and python3-dev"
        )
    return candidates[0]


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
