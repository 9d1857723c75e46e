"""Node side of CODA for Slurm: the ``coda-node`` daemon and its status view."""

__version__ = "0.1.0"
