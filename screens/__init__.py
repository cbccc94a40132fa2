"""The Textual UI of zdoctor: thin screens over the headless engine."""

from __future__ import annotations
