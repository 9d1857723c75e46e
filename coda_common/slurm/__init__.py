"""Slurm's syntax: squeue/sacct JSON records, cpu ranges, the hook's admin_comment record."""
