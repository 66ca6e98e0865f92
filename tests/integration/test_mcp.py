"""Corral's MCP server driven by the ``mcp`` package's own client, over both transports: ``corral mcp``
spawned on stdio against a real gateway, and the gateway's ``/mcp`` (Streamable HTTP, the 2025
handshake and the 2026-07-28 revision). Each one makes a session, looks at it, types into a real page,
runs a command, writes and reads a file, reads the audit summary and ends the session; a session
token does what its session may and nothing more; ``/mcp`` without a credential is a 401."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent, TextContent

from corral.mcp import ANNOTATIONS

from .conftest import html_url
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SERVICES = str(Path(__file__).resolve().parents[2] / "services")
# One input over the whole page: a click anywhere focuses it, and what it holds becomes the title.
PAGE = html_url(
    '<input id=box style="position:fixed;inset:0;width:100%;height:100%;font-size:40px">',
    "box.addEventListener('input', () => { document.title = 'typed:' + box.value })",
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-mcp") as running:
        yield running


@asynccontextmanager
async def over_http(gw: RunningGateway, credential: str, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {credential}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120, read=300)) as http,
        Client(streamable_http_client(f"{gw.url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


@asynccontextmanager
async def over_stdio(gw: RunningGateway, credential: str) -> AsyncIterator[Client]:
    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": credential, "PYTHONPATH": SERVICES}
    server = StdioServerParameters(command=sys.executable, args=["-m", "corral.cli", "mcp"], env=env)
    async with Client(server) as client:
        yield client


@asynccontextmanager
async def connect(gw: RunningGateway, transport: str, credential: str = KEY_A) -> AsyncIterator[Client]:
    if transport == "stdio":
        async with over_stdio(gw, credential) as client:
            yield client
    else:
        async with over_http(gw, credential, "legacy" if transport == "http-2025" else "auto") as client:
            yield client


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    return result


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(client, tool, **arguments)
    assert not result.is_error, result.content
    return result.structured_content or {}


def failure(result: CallToolResult) -> dict[str, Any]:
    """A tool error's Corral error (and its text says the same)."""
    assert result.is_error
    error: dict[str, Any] = (result.structured_content or {})["error"]
    text = result.content[0]
    assert isinstance(text, TextContent) and text.text.startswith(f"{error['code']}: ")
    return error


def images(result: CallToolResult) -> list[bytes]:
    return [base64.b64decode(block.data) for block in result.content if isinstance(block, ImageContent)]


async def title(client: Client, session_id: str, expected: str | None = None, timeout_s: float = 15.0) -> str:
    """The active tab's title; with ``expected``, once it is that (or the last one read at the timeout):
    typed keys reach the page after the tool answered (as conftest.await_title waits for them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tabs = (await ok(client, "list_tabs", session_id=session_id))["tabs"]
        current = str(next(tab for tab in tabs if tab.get("active"))["title"])
        if expected is None or current == expected or time.monotonic() > deadline:
            return current
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("transport", ["stdio", "http-2025", "http-2026"])
async def test_a_session_from_start_to_end(gw: RunningGateway, transport: str) -> None:
    async with connect(gw, transport) as client:
        if transport == "http-2026":
            assert client.session.protocol_version == "2026-07-28"
        elif transport == "http-2025":
            assert client.session.protocol_version.startswith("2025-")
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == set(ANNOTATIONS)
        assert listed["screenshot"].annotations == ANNOTATIONS["screenshot"]
        assert listed["end_session"].annotations is not None and listed["end_session"].annotations.destructive_hint

        session = await ok(client, "create_session", allow=["example.test"])
        session_id = session["id"]
        assert session_id.startswith("ses_") and "token" not in session
        try:
            shot = await call(client, "screenshot", session_id=session_id)
            assert not shot.is_error and images(shot)[0].startswith(b"\x89PNG")

            opened = await call(client, "navigate", session_id=session_id, url=PAGE)
            assert not opened.is_error and images(opened)  # answered with the screen after it
            await ok(client, "click", session_id=session_id, x=200, y=200, screenshot=False)
            typed = await call(client, "type_text", session_id=session_id, text="hi mcp")
            assert not typed.is_error and images(typed)
            assert await title(client, session_id, "typed:hi mcp") == "typed:hi mcp"

            ran = await ok(client, "exec", session_id=session_id, command="echo out; echo err >&2; exit 3")
            assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, "out\n", "err\n")

            await ok(client, "write_file", session_id=session_id, path="notes/a.txt", content="héllo\n")
            read = await ok(client, "read_file", session_id=session_id, path="/workspace/notes/a.txt")
            assert (read["content"], read["encoding"]) == ("héllo\n", "utf-8")

            # Bad input is the model's to read: a tool error with Corral's code, and the session goes on.
            assert failure(await call(client, "click", session_id=session_id, x=99_999, y=5))["code"] == (
                "out_of_bounds"
            )
            assert failure(await call(client, "read_file", session_id=session_id, path="/nope"))["code"] == (
                "no_such_file"
            )
            assert failure(await call(client, "click", session_id=session_id, x="here", y=1))["code"] == (
                "invalid_request"
            )
            assert failure(await call(client, "format_disk"))["code"] == "unknown_tool"
            # Chromium's own pages and the sandbox's files are not the model's to open, as over CDP.
            for url in ("chrome://settings", "file:///etc/passwd", "view-source:https://example.test/"):
                for tool, arguments in (("navigate", {"url": url}), ("new_tab", {"url": url})):
                    refused = failure(await call(client, tool, session_id=session_id, **arguments))
                    assert (refused["code"], refused.get("field")) == ("url_refused", "action.url"), refused
            blocked = await ok(client, "navigate", session_id=session_id, url="http://blocked.invalid/")
            assert blocked["status"] == 403  # the egress proxy's refusal page
            assert not (await call(client, "screenshot", session_id=session_id)).is_error

            summary = await ok(client, "audit_summary", session_id=session_id)
            hosts = {row["host"]: row for row in summary["hosts"]}
            assert hosts["blocked.invalid"]["blocked"] >= 1 and summary["total"]["blocked"] >= 1
        finally:
            ended = await ok(client, "end_session", session_id=session_id)
        assert ended == {"id": session_id, "ended": True}
        assert failure(await call(client, "screenshot", session_id=session_id))["code"] == "not_found"
        listed_after = await ok(client, "list_sessions")
        assert session_id not in {s["id"] for s in listed_after["sessions"]}


@pytest.mark.parametrize("transport", ["stdio", "http-2026"])
async def test_a_session_token_opens_its_own_session_only(gw: RunningGateway, transport: str) -> None:
    with gw.client(KEY_A) as api:
        mine = api.post("/v1/sessions", json={}).json()
        other = api.post("/v1/sessions", json={}).json()
    try:
        async with connect(gw, transport, mine["token"]) as client:
            await ok(client, "exec", session_id=mine["id"], command="true")
            assert images(await call(client, "screenshot", session_id=mine["id"]))
            assert failure(await call(client, "screenshot", session_id=other["id"]))["code"] == "forbidden"
            assert failure(await call(client, "end_session", session_id=other["id"]))["code"] == "forbidden"
            assert failure(await call(client, "create_session"))["code"] == "unauthorized"
            assert failure(await call(client, "list_sessions"))["code"] == "unauthorized"
            assert "total" in await ok(client, "audit_summary", session_id=mine["id"])  # its own, while it lives
            assert failure(await call(client, "audit_summary", session_id=other["id"]))["code"] == "forbidden"
        with gw.client(KEY_A) as api:
            assert api.get(f"/v1/sessions/{other['id']}").status_code == 200  # still there
        # Another key's MCP client cannot see or end them either.
        async with connect(gw, transport, KEY_B) as client:
            assert failure(await call(client, "end_session", session_id=mine["id"]))["code"] == "forbidden"
            assert (await ok(client, "list_sessions"))["sessions"] == []
    finally:
        with gw.client(KEY_A) as api:
            for session in (mine, other):
                api.delete(f"/v1/sessions/{session['id']}")


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.mark.parametrize("credential", [None, "not-a-key"])
def test_mcp_needs_a_credential_before_anything_is_read(gw: RunningGateway, credential: str | None) -> None:
    with gw.client(credential) as http:
        answer = http.post("/mcp", content=json.dumps(INITIALIZE), headers=MCP_HEADERS)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"
    assert "mcp-session-id" not in answer.headers


def test_mcp_refuses_a_foreign_host_or_origin_and_an_oversized_body(gw: RunningGateway) -> None:
    with gw.client(KEY_A) as http:
        body = json.dumps(INITIALIZE)
        assert http.post("/mcp", content=body, headers={**MCP_HEADERS, "host": "evil.test"}).status_code == 421
        origin = {**MCP_HEADERS, "origin": "http://evil.test"}
        assert http.post("/mcp", content=body, headers=origin).status_code == 403
        big = http.post("/mcp", content=b"x" * ((gw.settings.max_body_kb << 10) + 1), headers=MCP_HEADERS)
        assert big.status_code == 413 and big.json()["error"]["code"] == "message_too_large"
        fine = http.post("/mcp", content=body, headers=MCP_HEADERS)
        assert fine.status_code == 200, fine.text
