"""Corral's MCP server in process (the ``mcp`` package's in-memory client), its tools reaching a fake
gateway (httpx's MockTransport) that records what each tool sent and answers what a test says."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp_types import CallToolResult

from corral.gateway_client import AsyncGateway
from corral.mcp import build_server

Answer = Callable[[httpx.Request], httpx.Response]


def reply(result: dict[str, Any] | None = None, **fields: Any) -> httpx.Response:
    """A sandbox's ``ok`` reply relayed by the gateway."""
    return httpx.Response(200, json={"ok": True, "id": None, "result": result or {}, **fields})


class FakeGateway:
    """A :class:`corral.mcp.access.GatewayAccess` whose gateway is ``answer``; ``sent`` keeps every request."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []
        self.answer: Answer = lambda request: reply()
        self.credential = "unit-key"

    def gateway(self, request: Any) -> AsyncGateway:
        def handle(sent: httpx.Request) -> httpx.Response:
            self.sent.append(sent)
            return self.answer(sent)

        return AsyncGateway("http://gw.test", self.credential, transport=httpx.MockTransport(handle))

    def bodies(self) -> list[Any]:
        return [json.loads(request.content) for request in self.sent if request.content]


@pytest.fixture()
def fake() -> FakeGateway:
    return FakeGateway()


@asynccontextmanager
async def connect(fake: FakeGateway) -> AsyncIterator[Client]:
    """A client of the server over ``fake``, in process (entered in the test's own task: the SDK's
    task groups must be left where they were entered)."""
    async with Client(build_server(fake)) as connected:
        yield connected


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    return result
