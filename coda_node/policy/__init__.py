"""What a tick decides, pure: targets from limits, the profiler's allocator and its
observations, the contention eliminator, usage records. No file, clock or hardware access.
"""
