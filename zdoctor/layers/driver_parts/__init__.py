"""The node layer ``driver-parts``: the driver's parts (the loaded kernel module, the user-space libraries, the
package record, Fabric Manager and the libcuda.so.1 a process resolves).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
