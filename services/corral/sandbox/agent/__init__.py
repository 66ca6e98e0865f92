"""Processes and the launcher: what runs as the agent's uid, its environment, its output, its freeze."""
