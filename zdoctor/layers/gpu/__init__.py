"""The node layer ``gpu``: GPUs (NVML: each GPU's state, PCIe link, memory, ECC and health).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
