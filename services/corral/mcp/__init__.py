"""Corral as an MCP server (the official ``mcp`` SDK): its tools (corral.mcp.tools), the server
factory (corral.mcp.server) and its transports, ``corral mcp`` on stdio (corral.mcp.stdio) and
``/mcp`` on the gateway (corral.mcp.transports). docs/mcp.md says how to add it to an MCP client.

The names below load on first use: ``corral mcp`` imports the stdio transport alone, so a client
install (the ``mcp`` extra, without the gateway's FastAPI) runs it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.mcp.access import FixedCredential, ForwardedBearer, GatewayAccess
    from corral.mcp.server import build_server
    from corral.mcp.stdio import serve_stdio
    from corral.mcp.tools import ANNOTATIONS, CorralTools
    from corral.mcp.transports import mount

_LAZY = {
    "ANNOTATIONS": "corral.mcp.tools",
    "CorralTools": "corral.mcp.tools",
    "FixedCredential": "corral.mcp.access",
    "ForwardedBearer": "corral.mcp.access",
    "GatewayAccess": "corral.mcp.access",
    "build_server": "corral.mcp.server",
    "mount": "corral.mcp.transports",
    "serve_stdio": "corral.mcp.stdio",
}

__all__ = [
    "ANNOTATIONS",
    "CorralTools",
    "FixedCredential",
    "ForwardedBearer",
    "GatewayAccess",
    "build_server",
    "mount",
    "serve_stdio",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.mcp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
