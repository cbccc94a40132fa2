"""Offload capacity and configuration: read a ds_config the way DeepSpeed does, lint it, plan memory
against this machine, and read the timings a crawling job prints.

- :mod:`.dsconfig`: the reader (DeepSpeed's HJSON dialect with positions), the NVMe patch and its
  careful application.
- :mod:`.lint`: DeepSpeed's field lists and defaults (from the installed source, or a static copy) and
  the lints over a config.
- :mod:`.planner`: DeepSpeed's ZeRO-2/ZeRO-3 memory estimators, parameter counts from a Hugging Face
  ``config.json``, and the needs set against this machine.
- :mod:`.walllog`: ``wall_clock_breakdown`` lines of a training log.
- :mod:`.gpusample`: GPU utilisation sampled through NVML.
"""

from __future__ import annotations
