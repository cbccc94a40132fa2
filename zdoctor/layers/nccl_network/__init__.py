"""The node layer ``nccl-network``: NCCL's network (interfaces, routes and InfiniBand ports against the NCCL
variables and the other nodes' addresses).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.
"""
