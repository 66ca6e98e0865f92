"""Where sandboxes run. Only :mod:`corral.runtime.docker` talks to Docker."""
