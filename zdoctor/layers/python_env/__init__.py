"""The node layer ``python-env``: the training environment (the interpreter, torch, DeepSpeed and its release rules).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
