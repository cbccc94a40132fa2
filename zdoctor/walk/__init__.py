"""The walk: playbooks and their conditions, the engine, the session log and its events, check, the guide's
steps, practice, resume and applying a remedy."""
