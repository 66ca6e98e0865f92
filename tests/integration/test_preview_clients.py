"""Previews from the client side against the real images and a real gateway: the SDK (both twins), the
CLI and the MCP tools make, list and revoke them (a session token refused by each); and a real
Chromium on the host shows each preview's origin apart: a preview page cannot read the API, nor
another preview's page (another port, another session) nor its cookie, the preview's cookie is
HttpOnly and host-only, and a WebSocket echo works through the preview."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.errors import GatewayError
from corral.gateway_client import AsyncGateway
from corral.gateway_models import Preview
from corral.sdk import AsyncSandbox, Sandbox
from corral.sdk.previews import AsyncPreviews

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, free_port, module_gateway
from .preview_fixtures import WAIT_LISTENING

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SERVICES = str(Path(__file__).resolve().parents[2] / "services")
APP = (Path(__file__).parent / "preview_apps" / "app.py").read_text()
TOKEN = "corral_preview_token="


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    # Each test gateway has a preview listener on a free port of its own (gateway_fixtures).
    with module_gateway(tmp_path_factory, runtime, "previewclients") as served:
        yield served


def _serving(box: Sandbox, *ports: int) -> Sandbox:
    box.files.write("/workspace/app.py", APP)
    for port in ports:
        box.processes.start(argv=["python3", "/workspace/app.py", str(port)])
    box.exec(argv=["python3", "-c", WAIT_LISTENING, *map(str, ports)], timeout_ms=30_000).check()
    return box


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as box:
        yield _serving(box, 3000, 3001)


@pytest.fixture(scope="module")
def other(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as box:
        yield _serving(box, 3000)


def _preview_port(gw: RunningGateway) -> int:
    return int(gw.settings.preview_port)


def _get(gw: RunningGateway, preview: Preview, path: str = "/", secret: str | None = None) -> httpx.Response:
    """A request to the preview listener as a browser would send it (its Host), with the secret as the
    header a program sends (None: the one in the preview's URL)."""
    token = secret if secret is not None else preview.url.split(TOKEN, 1)[1]
    headers = {"host": f"{preview.host}:{_preview_port(gw)}", "x-corral-preview-token": token}
    return httpx.get(f"http://127.0.0.1:{_preview_port(gw)}{path}", headers=headers, timeout=30)


# -- the SDK, the CLI and MCP -----------------------------------------------------------------------------


def test_the_sdk_makes_lists_and_revokes_a_preview(gw: RunningGateway, sb: Sandbox) -> None:
    made = sb.previews.create(3000, ttl_s=600)
    assert isinstance(made, Preview) and made.id.startswith("prv_") and made.port == 3000
    assert made.host == sb.get_host(3000) == f"3000-{sb.id.removeprefix('ses_')}.localhost"
    assert made.url.startswith(f"http://{made.host}:{_preview_port(gw)}/?{TOKEN}crl_prev_")
    assert 590 <= made.expires_at - made.created_at <= 600
    assert made.sandbox_url == f"http://{made.host}:8701/"
    page = _get(gw, made)
    assert page.status_code == 200 and "<title>preview-app 3000</title>" in page.text
    row = next(row for row in sb.previews.list() if row.id == made.id)
    assert row.connections >= 1 and row.bytes_out >= len(page.content) and row.revoked_at is None
    assert "url" not in row.wire() and TOKEN not in json.dumps(row.wire())
    revoked = sb.previews.revoke(made.id)
    assert revoked.id == made.id and revoked.revoked_at >= made.created_at
    assert _get(gw, made).status_code == 401
    assert next(row for row in sb.previews.list() if row.id == made.id).revoked_at == revoked.revoked_at


async def test_the_async_twin_does_the_same(gw: RunningGateway, sb: Sandbox) -> None:
    twin = await AsyncSandbox.attach(sb.id, sb._token, url=gw.url)  # the token: refused (below)
    try:
        with pytest.raises(GatewayError) as refused:
            await twin.previews.create(3001)
        assert refused.value.status == 403 and refused.value.code == "forbidden"
    finally:
        await twin.close()
    async with AsyncGateway(gw.url, KEY_A) as gateway:  # the owner's: the twin's part over it
        owner = AsyncPreviews(gateway, sb.id)
        made = await owner.create(3001)
        assert made.port == 3001 and made.host == sb.get_host(3001)
        assert _get(gw, made).status_code == 200
        assert any(row.id == made.id for row in await owner.list())
        assert (await owner.revoke(made.id)).id == made.id


def test_a_session_token_cannot_make_list_or_revoke_previews(gw: RunningGateway, sb: Sandbox) -> None:
    agent = Sandbox.attach(sb.id, sb._token, url=gw.url)
    try:
        for call in (lambda: agent.previews.create(3000), agent.previews.list, lambda: agent.previews.revoke("prv_x")):
            with pytest.raises(GatewayError) as refused:
                call()
            assert refused.value.status == 403 and refused.value.code == "forbidden"
    finally:
        agent.close()


def _cli(gw: RunningGateway, *argv: str, key: str = KEY_A) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_URL": gw.url, "CORRAL_API_KEY": key, "PYTHONPATH": SERVICES}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "preview", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_makes_lists_and_revokes_a_preview(gw: RunningGateway, sb: Sandbox) -> None:
    made = _cli(gw, "create", sb.id, "3001", "--ttl", "300")
    assert made.returncode == 0, made.stderr
    url = made.stdout.strip()
    assert url.startswith(f"http://3001-{sb.id.removeprefix('ses_')}.localhost:{_preview_port(gw)}/?{TOKEN}")
    assert "8701/" in made.stderr  # the sandbox's own address, beside
    listed = _cli(gw, "list", sb.id, "--json")
    rows = json.loads(listed.stdout)["previews"]
    mine = next(row for row in rows if row["port"] == 3001 and row["revoked_at"] is None)
    assert url.split(TOKEN, 1)[1] not in listed.stdout
    revoked = _cli(gw, "revoke", sb.id, mine["id"], "--json")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["id"] == mine["id"]
    refused = _cli(gw, "create", sb.id, "3001", key=sb._token)
    assert refused.returncode == 1 and "forbidden" in refused.stderr and "Traceback" not in refused.stderr
    reserved = _cli(gw, "create", sb.id, "8765")
    assert reserved.returncode == 1 and "reserved" in reserved.stderr


async def test_the_mcp_tools_as_the_owner_and_as_the_agent(gw: RunningGateway, sb: Sandbox) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def tool(credential: str, name: str, **arguments: Any) -> Any:
        headers = {"Authorization": f"Bearer {credential}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120, read=300)) as http,
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client,
        ):
            return await client.call_tool(name, arguments)

    made = await tool(KEY_A, "preview_port", session_id=sb.id, port=3000)
    assert not made.is_error, made.content
    shown = made.structured_content
    assert shown["url"].startswith(f"http://{shown['host']}:{_preview_port(gw)}/?{TOKEN}")
    assert shown["sandbox_url"] == f"http://{shown['host']}:8701/"
    listed = await tool(KEY_A, "list_previews", session_id=sb.id)
    assert any(row["id"] == shown["id"] for row in listed.structured_content["previews"])
    agent = await tool(sb._token, "preview_port", session_id=sb.id, port=3000)
    assert agent.is_error and agent.structured_content["error"]["code"] == "forbidden"
    revoked = await tool(KEY_A, "revoke_preview", session_id=sb.id, preview_id=shown["id"])
    assert not revoked.is_error and revoked.structured_content["id"] == shown["id"]


def test_the_sandboxs_browser_opens_the_sandbox_url_the_clients_give(sb: Sandbox) -> None:
    made = sb.previews.create(3001)
    try:
        assert sb.navigate(made.sandbox_url).title == "preview-app 3001"
    finally:
        sb.previews.revoke(made.id)


# -- the origin, in a real browser on the host -------------------------------------------------------------


def _wait_title(page: Any, wanted: str, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while (title := page.title()) != wanted and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    return str(title)


@pytest.fixture(scope="module")
def opened(gw: RunningGateway, sb: Sandbox, other: Sandbox, browser: Any) -> Iterator[dict[str, Any]]:
    """Three previews (two ports of one session, one of another) opened by their URLs in one browser
    context, as a person would: each first visit's cookie kept."""
    previews = {
        "a": sb.previews.create(3000),
        "b": sb.previews.create(3001),
        "c": other.previews.create(3000),
    }
    context = browser.new_context()
    page = context.new_page()
    for made in previews.values():
        response = page.goto(made.url)
        assert response is not None and response.status == 200
        assert "corral_preview_token" not in page.url  # the 303 took the secret out of the address
    yield {"context": context, "page": page, **previews}
    context.close()


def test_the_preview_cookie_is_http_only_and_host_only(opened: dict[str, Any]) -> None:
    cookies = opened["context"].cookies()
    ours = [c for c in cookies if c["name"].startswith("corral_preview_")]
    assert sorted(c["domain"] for c in ours) == sorted(opened[k].host for k in "abc")  # no leading dot: host-only
    assert all(c["httpOnly"] and c["sameSite"] == "Lax" for c in ours)
    page = opened["page"]
    page.goto(_address(opened["a"]) + "cookie")
    assert "corral_preview_" not in page.evaluate("document.cookie")  # the page's script cannot read it
    assert page.evaluate("document.cookie") == "app3000=kept"  # the app's own cookie, its own host's


def test_a_preview_page_cannot_read_the_api(gw: RunningGateway, opened: dict[str, Any]) -> None:
    page = opened["page"]
    page.goto(_address(opened["a"]))
    read = page.evaluate(
        """async (api) => {
            try { const r = await fetch(api + '/v1/sessions', {credentials: 'include'}); return 'read ' + r.status; }
            catch (e) { return 'blocked ' + e.name; }
        }""",
        gw.url,
    )
    assert read == "blocked TypeError"
    opaque = page.evaluate(
        """async (api) => {
            const r = await fetch(api + '/v1/sessions', {mode: 'no-cors', credentials: 'include'});
            return r.type + ' ' + r.status + ' ' + (await r.text()).length;
        }""",
        gw.url,
    )
    assert opaque == "opaque 0 0"


@pytest.mark.parametrize("target", ["b", "c"])  # another port of the session, another session's
def test_a_preview_page_cannot_read_another_previews_page(opened: dict[str, Any], target: str) -> None:
    page = opened["page"]
    page.goto(_address(opened["a"]))
    there = _address(opened[target])
    read = page.evaluate(
        """async (url) => {
            try { const r = await fetch(url, {credentials: 'include'}); return 'read ' + (await r.text()); }
            catch (e) { return 'blocked ' + e.name; }
        }""",
        there,
    )
    assert read == "blocked TypeError"
    framed = page.evaluate(
        """(url) => new Promise((done) => {
            const frame = document.createElement('iframe');
            frame.onload = () => {
                if (frame.contentDocument !== null) { done('read ' + frame.contentDocument.title); return; }
                try { done('read ' + frame.contentWindow.document.title); } catch (e) { done('blocked ' + e.name); }
            };
            frame.src = url;
            document.body.appendChild(frame);
        })""",
        there,
    )
    assert framed == "blocked SecurityError"
    assert "corral_preview_" not in page.evaluate("document.cookie")


HIJACK = """(url) => new Promise((done) => {
    const ws = new WebSocket(url);
    ws.onopen = () => ws.send('from the page of ' + location.host);
    ws.onmessage = (e) => { done('read ' + e.data); ws.close(); };
    ws.onerror = () => done('blocked');
})"""


def test_on_a_domain_of_its_own_another_sessions_page_cannot_use_this_previews_cookie(
    tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, browser: Any
) -> None:
    # A gateway whose previews are under a domain of the operator's (preview.test here, as a real
    # deployment's preview.example.com): the browser takes every preview under it for one site, so
    # SameSite=Lax lets a page of another session's preview (another agent's) open a WebSocket to
    # this preview (CORS does not guard one) with this preview's cookie, and read its answers. The
    # gateway must refuse that cookie from another session's page; a page of the same session's
    # other port still may use it, and a link followed from anywhere is served.
    from .conftest import CHROMIUM

    domain = "preview.test"
    with (
        module_gateway(
            tmp_path_factory, runtime, "previewsite", preview_port=free_port(), preview_domain=domain
        ) as served,
        Sandbox.create(url=served.url, api_key=KEY_A) as mine,
        Sandbox.create(url=served.url, api_key=KEY_A) as theirs,
    ):
        _serving(mine, 3000, 3001)
        _serving(theirs, 3000)
        a, b, c = mine.previews.create(3000), mine.previews.create(3001), theirs.previews.create(3000)
        # A browser of its own (the shared one's playwright), told that the domain's names are this host.
        rules = f"--host-resolver-rules=MAP *.{domain} 127.0.0.1"
        chromium = browser.browser_type.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", rules])
        try:
            page = chromium.new_context().new_page()
            for made in (a, b, c):
                response = page.goto(made.url)
                assert response is not None and response.status == 200
            target = _address(a).replace("http://", "ws://") + "ws"
            page.goto(_address(c))
            hijacked = page.evaluate(HIJACK, target)
            page.goto(_address(b))
            sibling = page.evaluate(HIJACK, target)
            page.goto(_address(c))
            page.evaluate("(url) => { location.href = url; }", _address(a))
            followed = _wait_title(page, "preview-app 3000")
        finally:
            chromium.close()
    assert hijacked == "blocked"
    assert sibling.startswith(f"read echo:from the page of {b.host}:"), sibling
    assert followed == "preview-app 3000"


def test_a_websocket_echo_through_the_preview_from_the_browser(opened: dict[str, Any]) -> None:
    page = opened["page"]
    page.goto(_address(opened["c"]) + "wspage")
    assert _wait_title(page, "ws echo:hi from the page") == "ws echo:hi from the page"


def _address(made: Preview) -> str:
    """The preview's address without its secret (the browser holds its cookie)."""
    return made.url.split("?", 1)[0]
