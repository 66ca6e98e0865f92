"""Port previews as MCP tools (:class:`PreviewTools`, a part of :class:`corral.mcp.tools.CorralTools`):
a server the agent runs in its sandbox, opened for a person outside and for the sandbox's own
browser (docs/previews.md).

The gateway's preview routes take the owner's API key only, and MCP adds no privilege
(:mod:`corral.mcp.access`): these tools work for a caller holding an API key (``corral mcp`` with the
owner's key, or ``/mcp`` with it as the bearer), and a session token's call is the gateway's 403, a
tool error. An agent confined to its session by its token cannot open its sandbox to the world.
"""

from __future__ import annotations

from typing import Annotated

from mcp_types import CallToolResult
from pydantic import Field

from corral.gateway_client import AsyncGateway
from corral.mcp import results
from corral.mcp.base import Ctx, SessionId, ToolBase

PreviewId = Annotated[str, Field(min_length=1, description="The preview's id (prv_...), as preview_port gives it.")]


class PreviewTools(ToolBase):
    """Open, list and revoke a session's port previews."""

    async def preview_port(
        self,
        ctx: Ctx,
        session_id: SessionId,
        port: Annotated[int, Field(ge=1, le=65535, description="The port a server listens on inside the session.")],
        ttl_s: Annotated[
            int | None,
            Field(ge=1, le=86_400, description="Seconds the preview lives (default an hour; never past the session)."),
        ] = None,
    ) -> CallToolResult:
        """Show a web server running in the session (say `python -m http.server 3000`): answers `url`, which
        a person outside opens (it carries the preview's secret: share it only with whom should see the
        server), and `sandbox_url`, which the session's own browser opens with navigate. API key only."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            made = await gateway.create_preview(session_id, port, ttl_s)
            summary = (
                f"preview {made.id} of port {made.port}: {made.url} (for people outside; it carries the secret). "
                f"The session's own browser opens {made.sandbox_url}"
            )
            return results.data(made.shown(), summary)

        return await self._call(ctx, work)

    async def list_previews(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """The session's port previews: port, host, expiry, revoked or not, connections and bytes (never a
        secret: a lost URL is revoked and made again). API key only."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            rows = await gateway.previews(session_id)
            return results.data({"previews": [row.wire() | {"sandbox_url": row.sandbox_url} for row in rows]})

        return await self._call(ctx, work)

    async def revoke_preview(self, ctx: Ctx, session_id: SessionId, preview_id: PreviewId) -> CallToolResult:
        """Revoke a preview: its URL is refused from now on and its open connections close. API key only."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            revoked = await gateway.revoke_preview(session_id, preview_id)
            return results.data(revoked.wire(), f"preview {revoked.id} revoked")

        return await self._call(ctx, work)


__all__ = ["PreviewTools"]
