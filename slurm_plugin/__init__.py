"""Controller side of CODA for Slurm: the job_submit/coda hook, the CPU-demand model,
the profile store and the ``coda-slurm`` admin command."""

__version__ = "0.1.0"
