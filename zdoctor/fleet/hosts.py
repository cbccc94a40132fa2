"""The nodes of a job: the parsers live in :mod:`zdoctor.launch.hosts` (the launch probes read hostfiles
too); this module keeps the fleet's name for them."""

from __future__ import annotations

from zdoctor.launch.hosts import (
    MAX_HOSTS,
    Node,
    expand_nodelist,
    host_problem,
    parse_hostfile,
    read_hostfile,
    validate_host,
)

__all__ = ["MAX_HOSTS", "Node", "expand_nodelist", "host_problem", "parse_hostfile", "read_hostfile", "validate_host"]
