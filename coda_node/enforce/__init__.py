"""What a tick writes: the enforcer's cgroup and resctrl writes with their write-ahead state
file.
"""
