"""The node layer ``jit-build-log``: the JIT cache's build log (each op's .ninja_log and build.ninja against the
ninja and the environment the next launch uses).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
