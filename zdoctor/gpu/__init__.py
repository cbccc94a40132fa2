"""The GPU stack, layer by layer: driver and GPUs (NVML, nvidia-smi), the CUDA runtime torch was built
for, the toolkit (nvcc) DeepSpeed compiles ops with, NCCL, the environment and the host limits.

Modules (pure functions over data; the probes in :mod:`zdoctor.probes.gpu` do the I/O):

- :mod:`.nvml`: GPU facts through nvidia-ml-py, per-field "not supported", throttle-reason decoding, and
  the reader of a recorded NVML dump.
- :mod:`.smi`: ``nvidia-smi -q -x`` XML, ``--query-gpu`` CSV and the banner of plain ``nvidia-smi``.
- :mod:`.cuda`: CUDA versions, CUDA_HOME found the way torch finds it, DeepSpeed's and torch's nvcc rules,
  nvcc's host-compiler limits, wheel indexes and toolkit packages, ``collect_env`` output.
- :mod:`.nccl`: every libnccl.so.2 the training could load, with versions, and torch's own NCCL needs.
- :mod:`.envreview`: NCCL / c10d / CUDA environment variables.
- :mod:`.limits`: /dev/shm, memlock and open-file limits of the training environment.

Nothing here imports pynvml or torch at module import time.
"""

from __future__ import annotations
