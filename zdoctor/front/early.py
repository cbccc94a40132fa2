"""The slow live probes of a check, started as soon as the node's host is made: the traced import of the
training's modules (``livetrace``) and the target interpreter's own (``pyenv``) each take seconds of a
training interpreter's start, so they run while the rest of zdoctor (the checks, the playbooks) loads.

Only the modules that register these probes are imported first; every other probe starts with the checks.
"""

from __future__ import annotations

from zdoctor.host.base import Host
from zdoctor.layers.libraries import probe_libs
from zdoctor.layers.python_env import probe_pyenv

#: The probes started first, each registered by the module named beside it.
EARLY_PROBES = {"livetrace": probe_libs, "pyenv": probe_pyenv}


def start_early_probes(host: Host) -> None:
    """Start the slow live probes on ``host`` without waiting for them."""
    host.start(EARLY_PROBES)
