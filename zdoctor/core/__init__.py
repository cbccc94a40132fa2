"""The core vocabulary: errors, units, verdicts, the data model, the symptom record, the node layers' table, the
registry of probes, checks and predicates, the words renderers share, redaction and the recorded shape."""
