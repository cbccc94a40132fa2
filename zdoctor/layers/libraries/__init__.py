"""The node layer ``libraries``: shared libraries (what the training process loads and the versions it needs).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
