"""zdoctor: a doctor for GPU nodes where DeepSpeed ZeRO-3 Offload will not start, hangs, or crawls."""

from __future__ import annotations

__version__ = "0.1.0"
