"""`zdoctor fleet`: snapshot every node of a multi-node job through pdsh, ssh or srun, and show the skew.

hosts: the node list (DeepSpeed hostfile, plain list, Slurm node list) and host-name validation;
launch: the launcher argv (never a local shell); armor: the snapshot's transport encoding;
collect: running the launcher in parallel with per-node timeouts; skew: the facts that must agree;
result: the node x check matrix and the fleet report.
"""

from __future__ import annotations
