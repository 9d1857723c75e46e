"""Reading Slurm: scontrol and squeue/sacct JSON records, the hook's admin_comment record."""
