"""Remedies proven before they are offered: the trial machinery several layers share, and the guard that a
run zdoctor kills never leaves a stale JIT build lock."""
