"""Rules as data: what a given release of DeepSpeed or of the NVIDIA driver does, with the source
(pull request, release note or header) each entry was read from."""

from __future__ import annotations
