"""What a tick reads: the node snapshot (cgroups, GPUs, progress) and the memory-bandwidth
monitor.
"""
