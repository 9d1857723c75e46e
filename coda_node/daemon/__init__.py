"""The coda-node service: wiring from coda.conf, restart recovery, the tick that reads, decides
and writes, the profiler's loop and the events it logs.
"""
