"""Corral: disposable desktops with Chromium for computer-use agents.

The public surface: the SDK (:class:`Sandbox`, :class:`AsyncSandbox`), the low-level protocol
clients, and the exception hierarchy.
"""

from corral.client import ActionFailed, AsyncSandboxClient, SandboxClient
from corral.errors import ActionError, CorralError, ErrorCode, ImageBuildError, SandboxError
from corral.sdk import AsyncSandbox, GatewayError, Sandbox

__version__ = "0.1.0"

__all__ = [
    "ActionError",
    "ActionFailed",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "CorralError",
    "ErrorCode",
    "GatewayError",
    "ImageBuildError",
    "Sandbox",
    "SandboxClient",
    "SandboxError",
    "__version__",
]
