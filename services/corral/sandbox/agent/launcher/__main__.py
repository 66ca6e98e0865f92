"""``python -m corral.sandbox.agent.launcher``: the launcher server (:mod:`corral.sandbox.agent.launcher.server`)."""

import sys

from corral.sandbox.agent.launcher.server import main

sys.exit(main())
