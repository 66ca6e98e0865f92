"""What every MCP tool stands on: the parameters' types, and how a tool reaches the gateway as its
caller and turns a sandbox's reply into its answer (:class:`ToolBase`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar, cast

import httpx
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import BaseModel, Field

from corral.client import Envelope, Frame, Request
from corral.errors import CodedError, ErrorCode, RemoteError
from corral.gateway_client import AsyncGateway
from corral.mcp import results
from corral.mcp.access import GatewayAccess
from corral.sdk.messages import Message, reading

Ctx = Context[Any, Any]
T = TypeVar("T")

SessionId = Annotated[
    str, Field(min_length=1, description="The session's id (ses_...), as create_session or list_sessions gives it.")
]
X = Annotated[int, Field(ge=0, description="Pixels from the screen's left edge, in the screenshot's coordinates.")]
Y = Annotated[int, Field(ge=0, description="Pixels from the screen's top edge, in the screenshot's coordinates.")]
WithScreenshot = Annotated[
    bool, Field(description="Answer with a screenshot taken once the action settled (default true).")
]
Button = Literal["left", "right", "middle"]
# Under the gateway client's own timeout (corral.gateway_client.TIMEOUT_S): a longer wait would be cut
# there. The model may call again.
MAX_CONTROL_WAIT_MS = 100_000


def looked(screenshot: bool) -> Envelope:
    """An action's envelope: with a screenshot, taken once the screen settled (the native
    ``wait_for: "stable"``: no frame change for a while and the page done loading), so the model sees
    what its action did, not the frame before it (a key that submits a form answers the next page)."""
    return {"screenshot": True, "wait_for": "stable"} if screenshot else {"screenshot": False}


TabRef = Annotated[str | int, Field(description="The tab: its id or its index, as list_tabs gives them.")]


class ToolBase:
    """How the tools reach the gateway (:mod:`corral.mcp.access`) and answer."""

    def __init__(self, access: GatewayAccess) -> None:
        self._access = access

    async def _call(self, ctx: Ctx, work: Callable[[AsyncGateway], Awaitable[CallToolResult]]) -> CallToolResult:
        """``work`` with the caller's gateway client; a refusal on the way is a tool error."""
        try:
            gateway = self._access.gateway(ctx.request_context.request)
            try:
                return await work(gateway)
            finally:
                await gateway.close()
        except (CodedError, RemoteError) as exc:
            return results.refusal(exc)
        except httpx.HTTPError as exc:
            return results.error(ErrorCode.HTTP_ERROR, f"no answer from the gateway: {exc}")

    async def _answer(
        self, ctx: Ctx, session_id: str, message: Message[T], answer: Callable[[T, Frame], CallToolResult]
    ) -> CallToolResult:
        """One message to the session: what its reply is read as, as ``answer`` gives it (the reply
        beside it, for its screenshot), or the reply's error."""

        async def work(gateway: AsyncGateway) -> CallToolResult:
            # The gateway relays the sandbox's frame as it came (its route takes any message).
            reply = cast(Frame, await gateway.act(session_id, message.body))
            found = answer(message.read(reply), reply) if reply.get("ok") else results.reply_error(reply)
            # A human's hand-back note rides on one reply only: the model must read it there.
            return results.with_hand_back(found, reply)

        return await self._call(ctx, work)

    async def _act(
        self, ctx: Ctx, session_id: str, body: Request, model: type[BaseModel], summary: str
    ) -> CallToolResult:
        """One action: its result as ``model`` (and the screenshot its reply carries), or its error."""

        def answer(result: BaseModel, reply: Frame) -> CallToolResult:
            return results.with_screenshot(result, summary, reply)

        return await self._answer(ctx, session_id, Message(body, reading(model)), answer)
