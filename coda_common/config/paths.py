"""Where coda finds its configuration, the same way for the hook and every CLI."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CONF = Path("/etc/slurm/coda.conf")


def default_conf_path() -> Path:
    """coda.conf: ``$CODA_CONF``, else beside ``$SLURM_CONF``, else /etc/slurm/coda.conf."""
    if os.environ.get("CODA_CONF"):
        return Path(os.environ["CODA_CONF"])
    if os.environ.get("SLURM_CONF"):
        return Path(os.environ["SLURM_CONF"]).with_name("coda.conf")
    return DEFAULT_CONF


def slurm_conf_for(coda_conf: Path, configured: str | None) -> Path:
    """slurm.conf: ``SlurmConf=`` from coda.conf, else the one beside coda.conf."""
    return Path(configured) if configured else coda_conf.with_name("slurm.conf")
