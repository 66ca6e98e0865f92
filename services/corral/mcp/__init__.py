"""Corral as an MCP server (the official ``mcp`` SDK): its tools (corral.mcp.tools), the server
factory (corral.mcp.server) and its transports, ``corral mcp`` on stdio and ``/mcp`` on the gateway
(corral.mcp.transports). docs/mcp.md says how to add it to an MCP client."""

from corral.mcp.access import FixedCredential, ForwardedBearer, GatewayAccess
from corral.mcp.server import build_server
from corral.mcp.tools import ANNOTATIONS, CorralTools
from corral.mcp.transports import mount, serve_stdio

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
