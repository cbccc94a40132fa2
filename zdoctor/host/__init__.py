"""Where facts come from: the live machine, or a recorded snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zdoctor.host.base import Host
from zdoctor.host.live import LiveHost

if TYPE_CHECKING:
    from zdoctor.host.replay import ReplayHost, snapshot_document

__all__ = ["Host", "LiveHost", "ReplayHost", "snapshot_document"]


def __getattr__(name: str) -> Any:
    """The replay side loads when first asked for: the guide's first screen on this node needs none of it."""
    if name in ("ReplayHost", "snapshot_document"):
        from zdoctor.host import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
