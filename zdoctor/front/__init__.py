"""The front door: the command line, the fleet command, the TUI launcher and the isolating entry point."""
