"""Corral: disposable desktops with Chromium for computer-use agents.

The public surface: the SDK (:class:`Sandbox`, :class:`AsyncSandbox`), the low-level protocol
clients, and the exception hierarchy. Loaded on first use, so the in-sandbox controller does not
pay for the SDK's imports at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from corral.errors import ActionError, ActionFailed, CorralError, ErrorCode, GatewayError, ImageBuildError, SandboxError

if TYPE_CHECKING:
    from corral.client import AsyncSandboxClient, SandboxClient
    from corral.gateway_client import AsyncGateway, Gateway
    from corral.sdk import AsyncSandbox, Sandbox

__version__ = "0.1.0"

_LAZY = {
    "AsyncSandboxClient": "corral.client",
    "SandboxClient": "corral.client",
    "AsyncGateway": "corral.gateway_client",
    "AsyncSandbox": "corral.sdk",
    "Gateway": "corral.gateway_client",
    "Sandbox": "corral.sdk",
}

__all__ = [
    "ActionError",
    "ActionFailed",
    "AsyncGateway",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "CorralError",
    "ErrorCode",
    "Gateway",
    "GatewayError",
    "ImageBuildError",
    "Sandbox",
    "SandboxClient",
    "SandboxError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
