"""The control plane: one FastAPI gateway in front of every sandbox."""
