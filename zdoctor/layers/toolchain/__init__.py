"""The node layer ``toolchain``: compilers and the JIT build (gcc, nvcc, ninja and Python.h as the ops' build uses
them).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
