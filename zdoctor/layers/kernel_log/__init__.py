"""The node layer ``kernel-log``: the kernel log (NVIDIA Xid and NVRM records, PCIe AER errors, OOM-killer records).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
