"""coda-slurm reserve: the CPU-reservation plan and applying it to a cluster."""
