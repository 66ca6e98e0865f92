"""``corral mcp``: Corral's tools for an MCP client on stdin/stdout (docs/mcp.md). Needs the ``mcp``
extra: the MCP SDK brings a web stack of its own (starlette, uvicorn), so the client install leaves it
out (docs/design/0294-client-install.md)."""

from __future__ import annotations

from corral.cli import common


def mcp_stdio() -> None:
    """Serve Corral's tools to an MCP client on stdin/stdout (docs/mcp.md), calling the gateway on
    CORRAL_URL with CORRAL_API_KEY (an API key, or a session token for that session only)."""
    with common.needed("mcp", "mcp"):
        from corral.mcp import serve_stdio
    serve_stdio(common.url(), common.api_key())
