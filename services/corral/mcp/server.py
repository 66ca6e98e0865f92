"""The server factory: Corral's tools on the official MCP SDK's :class:`MCPServer`, which serves the
protocol's 2025 revisions (the ``initialize`` handshake) and 2026-07-28 (``server/discover``, no
session) as the SDK does, over whichever transport runs it (corral.mcp.transports)."""

from __future__ import annotations

import inspect
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool

from corral.mcp import arguments, results
from corral.mcp.access import GatewayAccess
from corral.mcp.tools import ANNOTATIONS, CorralTools

NAME = "corral"

INSTRUCTIONS = """\
Corral runs disposable sandboxes: a Linux desktop with Chromium, a shell and a /workspace, reaching \
only the hosts a session allows. Start one with create_session (or use a session you were given), look \
with screenshot, act with click, type_text, press_key, scroll, drag and navigate (each answers a \
screenshot taken after it), run commands with exec, move text in and out with read_file and \
write_file, see what it reached with audit_summary, and end it with end_session. Coordinates are \
pixels of the screenshot, which shows the whole screen: the browser's tab strip and address bar sit \
above the page, so look before you click."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:
        return "0"


async def coded_refusals(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Corral's code on the tool errors the SDK answers itself (corral.mcp.results.coded_sdk_refusal).
    The SDK's middleware seam is provisional: should it change, those errors lose the code, not more."""
    result = await call_next(ctx)
    if ctx.method == "tools/call" and isinstance(result, dict):
        return results.coded_sdk_refusal(result, str((ctx.params or {}).get("name", "")))
    return result


def checked_arguments(tools: dict[str, Tool]) -> ServerMiddleware[Any]:
    """A middleware refusing a ``tools/call`` whose arguments its tool cannot take, before the SDK runs
    it: every problem named, with what the tool expects (corral.mcp.arguments), not pydantic's text."""

    async def check(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        tool = tools.get(str(params.get("name", ""))) if ctx.method == "tools/call" else None
        given = params.get("arguments") or {}
        if tool is not None and isinstance(given, dict):
            found = arguments.problems(tool, given)
            if found:
                return arguments.refusal(tool, found)
        return await call_next(ctx)

    return check


def build_server(access: GatewayAccess) -> MCPServer[Any]:
    """A server whose tools reach the gateway through ``access``, as each request's caller."""
    methods = CorralTools(access).tools()
    tools = {
        # The docstring without its indentation (the SDK would send it as written).
        name: Tool.from_function(
            tool, name, description=inspect.getdoc(tool), annotations=ANNOTATIONS[name], structured_output=False
        )
        for name, tool in zip(ANNOTATIONS, methods, strict=True)
    }
    # The SDK configures the root logger when nothing has yet (logging.basicConfig): at WARNING, so a
    # stdio server does not fill its client's log with a line per HTTP request to the gateway.
    return MCPServer(
        NAME,
        title="Corral",
        instructions=INSTRUCTIONS,
        version=_version(),
        log_level="WARNING",
        tools=list(tools.values()),
        middleware=[coded_refusals, checked_arguments(tools)],
    )


__all__ = ["NAME", "build_server"]
