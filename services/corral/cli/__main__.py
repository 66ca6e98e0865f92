"""``python -m corral.cli``: the ``corral`` command."""

from corral.cli import main

main()
