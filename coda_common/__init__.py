"""What the controller (slurm_plugin) and the node daemon (coda_node) both use: coda.conf,
Slurm's syntax and JSON records, the profile store and its records, and the CPU-demand
model. It imports neither of them, so a GPU node installs it without the controller."""
