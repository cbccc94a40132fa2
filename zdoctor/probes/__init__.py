"""Probes: one module per subject, each registering functions Host -> (facts, evidence)."""
