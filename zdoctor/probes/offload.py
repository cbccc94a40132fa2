"""Registered vocabulary: filled in by its feature (empty until then)."""
