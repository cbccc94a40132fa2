"""The node layer ``gpu-capability``: the GPUs' capabilities against the job (compute capability against the
ds_config's precision and the arch list the ops are built for).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
