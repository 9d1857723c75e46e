"""The node's interfaces to the kernel, the hardware and Slurm: the system root, cgroups,
resctrl, perf, NVML, topology, progress files, Slurm's job records and the capability
probes.
"""
