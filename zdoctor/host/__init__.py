"""Where facts come from: the live machine, or a recorded snapshot."""

from __future__ import annotations

from .base import Host
from .live import LiveHost
from .replay import ReplayHost, snapshot_document

__all__ = ["Host", "LiveHost", "ReplayHost", "snapshot_document"]
