"""The browser's downloads as MCP tools (:class:`DownloadTools`, a part of
:class:`corral.mcp.tools.CorralTools`): what the session's browser downloaded, whoever started it, and
one download's content (docs/downloads.md). The owner's API key or the session's token, as the routes."""

from __future__ import annotations

import base64
from typing import Annotated, Final

from mcp_types import CallToolResult
from pydantic import Field

from corral.errors import DownloadTooLarge, ErrorCode
from corral.gateway_client import AsyncGateway
from corral.mcp import results
from corral.mcp.base import Ctx, SessionId, ToolBase

# A model is handed at most this much of a download; the SDK's and CLI's save stream any size.
MAX_TOOL_BYTES: Final = 4 << 20
DownloadId = Annotated[
    str, Field(min_length=1, max_length=64, description="The download's id, as list_downloads gives it.")
]


class DownloadTools(ToolBase):
    """List the session's downloads and read one."""

    async def list_downloads(self, ctx: Ctx, session_id: SessionId) -> CallToolResult:
        """What the session's browser downloaded (a navigate to a file, a click on a download link, a page):
        each one's id, file name (in ~/Downloads, where commands find it), size, MIME type, URL, state
        (in_progress, completed, canceled, capped, interrupted) and cause (the action that made it)."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            listing = await gateway.downloads(session_id)
            lines = [f"{row.id} {row.name} {row.size} bytes {row.state}" for row in listing.downloads]
            return results.data(listing.model_dump(mode="json"), "\n".join(lines) or "no downloads")

        return await self._call(ctx, work)

    async def read_download(self, ctx: Ctx, session_id: SessionId, download_id: DownloadId) -> CallToolResult:
        """A completed download's content: its text when it is UTF-8, else base64 (at most 4 MiB; the
        SDK's downloads.save and `corral downloads get` take any size)."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            listed = {row.id: row for row in (await gateway.downloads(session_id)).downloads}
            row = listed.get(download_id)
            if row is not None and row.size > MAX_TOOL_BYTES:
                message = f"download {download_id} is {row.size} bytes; a tool reads at most {MAX_TOOL_BYTES}"
                return results.error(ErrorCode.TOO_LARGE, message, "download_id")
            try:  # listed small is no bound: it may have grown (or been another) by the read
                content = await gateway.download_bytes(session_id, download_id, MAX_TOOL_BYTES)
            except DownloadTooLarge:
                message = f"download {download_id} is over {MAX_TOOL_BYTES} bytes; a tool reads at most that"
                return results.error(ErrorCode.TOO_LARGE, message, "download_id")
            try:
                text, encoding = content.decode(), "utf-8"
            except UnicodeDecodeError:
                text, encoding = base64.b64encode(content).decode(), "base64"
            answer = {"id": download_id, "content": text, "encoding": encoding, "size": len(content)}
            return results.data(answer, text if encoding == "utf-8" else None)

        return await self._call(ctx, work)


__all__ = ["DownloadTools"]
