"""The live view and the control lease: who drives, the agent's side of a takeover, viewers' streams."""
