"""coda-slurm: the admin commands."""
