"""Rules as data: what a given release of DeepSpeed, the NVIDIA driver or glibc does, with the source
(pull request, release note or header) each entry was read from."""

from __future__ import annotations
