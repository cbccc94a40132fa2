"""Where facts come from: the live machine, or a recorded snapshot."""

from __future__ import annotations

from zdoctor.host.base import Host
from zdoctor.host.live import LiveHost
from zdoctor.host.replay import ReplayHost, snapshot_document

__all__ = ["Host", "LiveHost", "ReplayHost", "snapshot_document"]
