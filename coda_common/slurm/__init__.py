"""Slurm's syntax: its configuration files (slurm.conf, the shared Key=Value syntax), host
lists, squeue/sacct JSON records, cpu ranges, the hook's admin_comment record."""
