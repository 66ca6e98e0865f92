"""``corral mcp``: the MCP server on stdin/stdout, a subprocess of the MCP client, calling a gateway
over HTTP with the CLI's URL and credential. Apart from :mod:`corral.mcp.transports` (the gateway's
``/mcp``), so a client install runs it without the gateway's web stack."""

from __future__ import annotations

from corral.mcp.access import FixedCredential
from corral.mcp.server import build_server


def serve_stdio(url: str, credential: str) -> None:
    """Serve on stdin/stdout until the client closes them; every tool calls the gateway at ``url``."""
    build_server(FixedCredential(url, credential)).run("stdio")
