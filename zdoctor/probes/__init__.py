"""Probes: one module per subject, each registering functions Host -> (facts, evidence)."""

from __future__ import annotations
