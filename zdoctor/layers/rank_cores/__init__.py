"""The node layer ``rank-cores``: ranks and cores (NUMA nodes, each rank's CPU affinity and thread count).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
