"""The launcher: the sandbox's one process that can act as the agent, for the controller alone.

- :mod:`~corral.sandbox.launcher.server`: the privileged single-threaded server (``python -m
  corral.sandbox.launcher``), started and restarted by :mod:`corral.sandbox.init`;
- :mod:`~corral.sandbox.launcher.shepherd`: one per process the agent runs; its tree, its end;
- :mod:`~corral.sandbox.launcher.fsops`: file operations with the agent's ids;
- :mod:`~corral.sandbox.launcher.messages`: the wire, pure;
- :mod:`~corral.sandbox.launcher.client`: :class:`LauncherClient`, the controller's async side.
"""

from corral.sandbox.launcher.client import Control, LauncherClient, Spawned, SpawnRefused
from corral.sandbox.launcher.messages import SOCKET_PATH, ShepherdEvent

__all__ = ["SOCKET_PATH", "Control", "LauncherClient", "ShepherdEvent", "SpawnRefused", "Spawned"]
