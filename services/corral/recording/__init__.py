"""Session recordings: the bundle format (docs/recording.md) and reading it back."""
