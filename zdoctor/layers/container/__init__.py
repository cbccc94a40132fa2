"""The node layer ``container``: the container and its limits (the container runtime, the job's cgroup memory and
pids limits, /dev/shm).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
