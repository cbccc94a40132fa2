"""The node layer ``ranks``: A hung job's ranks (each rank's state, wait channel and stack).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
