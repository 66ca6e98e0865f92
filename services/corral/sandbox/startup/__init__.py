"""Boot: the container's first process as root, the supervisor, their log lines."""
