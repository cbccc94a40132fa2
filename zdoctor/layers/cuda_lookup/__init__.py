"""The node layer ``cuda-lookup``: CUDA library lookup (libcuda in the loader's cache, the toolkit's stubs, the CUDA
sonames each extension needs).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
