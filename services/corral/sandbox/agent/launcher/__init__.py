"""The launcher: the sandbox's one process that can act as the agent, for the controller alone.

- :mod:`~corral.sandbox.agent.launcher.server`: the privileged single-threaded server (``python -m
  corral.sandbox.agent.launcher``), started and restarted by :mod:`corral.sandbox.startup.init`;
- :mod:`~corral.sandbox.agent.launcher.shepherd`: one per process the agent runs; its tree, its end;
- :mod:`~corral.sandbox.agent.launcher.fsops`: file operations with the agent's ids;
- :mod:`~corral.sandbox.agent.launcher.messages`: the wire, pure;
- :mod:`~corral.sandbox.agent.launcher.client`: :class:`LauncherClient`, the controller's async side.

The client's names load on first use: the launcher itself never imports asyncio, so it stays small
and every fork of it (one shepherd per command) copies less.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from corral.sandbox.agent.launcher.messages import SOCKET_PATH, ShepherdEvent

if TYPE_CHECKING:
    from corral.sandbox.agent.launcher.client import Control, LauncherClient, Spawned, SpawnRefused

__all__ = ["SOCKET_PATH", "Control", "LauncherClient", "ShepherdEvent", "SpawnRefused", "Spawned"]

_CLIENT = ("Control", "LauncherClient", "SpawnRefused", "Spawned")


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        return getattr(importlib.import_module("corral.sandbox.agent.launcher.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
