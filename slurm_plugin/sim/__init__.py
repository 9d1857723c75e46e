"""What-if simulator of a Slurm GPU cluster."""
