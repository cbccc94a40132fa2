"""Library forensics: ELF metadata, ld.so emulation, live loader traces, hung processes and remedies."""

from __future__ import annotations
