"""``python -m corral.sandbox.launcher``: the launcher server (see :mod:`corral.sandbox.launcher.server`)."""

import sys

from corral.sandbox.launcher.server import main

sys.exit(main())
