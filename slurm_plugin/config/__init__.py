"""Configuration: coda.conf's keys, slurm.conf's node shapes and caps, where files live."""
