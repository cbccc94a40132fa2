"""The node layer ``launch``: the launch (the launcher and the environment each rank needs, the hostfile).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
