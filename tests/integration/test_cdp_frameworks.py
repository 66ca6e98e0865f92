"""The browser frameworks on Corral's CDP endpoint, for real: Playwright MCP (npm, over stdio, driven by
the ``mcp`` client), browser-use's browser layer (PyPI, in a venv of its own, no model) and Puppeteer
(npm ``puppeteer-core``) connect through the real gateway to a real session's Chromium with the
session token, navigate to a page of the fake upstream (through the session's proxy, under .test) and
read it back.

The frameworks are pinned in tests/integration/frameworks/ and installed by scripts/bootstrap-frameworks
(a no-op once done; scripts/test runs it beside the images build). Neither downloads a browser or talks
to anything but loopback: telemetry, cloud sync and version checks are off.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ImageContent, TextContent
from playwright.async_api import async_playwright

from corral.errors import ActionFailed
from corral.sdk import AsyncSandbox

from .conftest import decode_image, find_color
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = Path(__file__).parent / "frameworks"
BROWSER_USE_PYTHON = ROOT / ".venv-browser-use" / "bin" / "python"
BROWSER_USE_PROBE = FRAMEWORKS / "browser_use_probe.py"
PUPPETEER_PROBE = FRAMEWORKS / "puppeteer_probe.mjs"

# What the frameworks may phone home with, off: browser-use's posthog telemetry, cloud sync, PyPI
# version check and cloud hints; Playwright's browser download (it only connects over CDP).
QUIET = {
    "ANONYMIZED_TELEMETRY": "false",
    "BROWSER_USE_CLOUD_SYNC": "false",
    "BROWSER_USE_VERSION_CHECK": "false",
    "BROWSER_USE_CLOUD_HINTS": "false",
    "BROWSER_USE_LOGGING_LEVEL": "warning",
    "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
}


@dataclass(frozen=True)
class Session:
    """A live session as a CDP client sees it: where to connect and with what."""

    sandbox: AsyncSandbox
    token: str
    cdp_url: str

    @property
    def header(self) -> str:
        return f"Authorization: Bearer {self.token}"


@pytest.fixture(scope="module")
def frameworks() -> None:
    """Playwright MCP, puppeteer-core and browser-use, installed (a no-op when they already are)."""
    subprocess.run([str(ROOT / "scripts" / "bootstrap-frameworks")], check=True, timeout=600)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-cdpfw-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"cdpfw-{os.getpid()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("cdpfw-gw"), instance) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


@pytest.fixture(scope="module")
async def sb(gw: RunningGateway) -> AsyncIterator[Session]:
    """One session for the module's frameworks (each connects and goes; starting a sandbox is the slow part)."""
    sandbox = await AsyncSandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"])
    try:
        yield Session(sandbox, sandbox.info.token, f"{gw.url}/v1/sessions/{sandbox.id}/cdp")
    finally:
        await sandbox.delete()


def quiet_env(home: Path) -> dict[str, str]:
    """A framework's environment: PATH, a scratch HOME, the switches above; no API keys."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), **QUIET}


@asynccontextmanager
async def playwright_mcp(cdp_endpoint: str, *headers: str, home: Path) -> AsyncIterator[Client]:
    """Playwright MCP on stdio, connected to ``cdp_endpoint`` (each of ``headers`` a ``--cdp-header``),
    started as docs/cdp.md writes it: ``npx @playwright/mcp@<the pinned version>``, from the frameworks'
    directory (npx finds the pinned install there; npm is told to stay offline)."""
    version = json.loads((FRAMEWORKS / "package.json").read_text())["dependencies"]["@playwright/mcp"]
    args = [f"@playwright/mcp@{version}", "--cdp-endpoint", cdp_endpoint, "--output-dir", str(home / "out")]
    for header in headers:
        args += ["--cdp-header", header]
    env = {**quiet_env(home), "npm_config_offline": "true", "npm_config_update_notifier": "false"}
    server = StdioServerParameters(command="npx", args=args, env=env, cwd=str(FRAMEWORKS))
    async with Client(server) as client:
        yield client


async def text_of(client: Client, tool: str, **arguments: object) -> str:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    assert not result.is_error, text
    return text


@pytest.mark.usefixtures("frameworks")
async def test_playwright_mcp_navigates_and_snapshots_through_the_gateway(
    sb: Session, upstream: Upstream, runtime: DockerHarness, tmp_path: Path
) -> None:
    async with playwright_mcp(sb.cdp_url, sb.header, home=tmp_path) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"browser_navigate", "browser_snapshot"} <= tools
        await text_of(client, "browser_navigate", url="https://allowed.test/frameworks/playwright-mcp")
        snapshot = await text_of(client, "browser_snapshot")
        assert "upstream allowed.test" in snapshot  # the page's title
        assert 'heading "allowed.test"' in snapshot and "/frameworks/playwright-mcp" in snapshot
        # A host the session does not allow: Corral's page, as for the agent's own navigation.
        await text_of(client, "browser_navigate", url="https://other.test/frameworks/denied")
        assert "Blocked by Corral" in await text_of(client, "browser_snapshot")
        # The same browser the agent drives: its tabs show the page Playwright MCP opened.
        urls = [tab.url for tab in await sb.sandbox.tabs()]
        assert "https://other.test/frameworks/denied" in urls, urls
        # Closing from Playwright MCP leaves the sandbox's browser running for the agent.
        await client.call_tool("browser_close", {})
        reply = await sb.sandbox.act({"type": "navigate", "url": "https://allowed.test/frameworks/after"})
        assert reply["result"]["title"] == "upstream allowed.test"
    paths = [hit.get("path") for hit in upstream.hits(runtime)]
    assert "/frameworks/playwright-mcp" in paths and "/frameworks/denied" not in paths


@pytest.mark.usefixtures("frameworks")
async def test_playwright_mcp_without_headers_through_a_connect_url(sb: Session, tmp_path: Path) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {sb.token}"}) as http:
        response = await http.post(f"{sb.cdp_url}/connect", json={"ttl_s": 60})
    assert response.status_code == 200, response.text
    async with playwright_mcp(response.json()["http_url"], home=tmp_path) as client:
        await text_of(client, "browser_navigate", url="https://allowed.test/frameworks/ticket")
        assert "/frameworks/ticket" in await text_of(client, "browser_snapshot")


async def run_probe(*argv: str, home: Path) -> dict[str, Any]:
    """A framework's probe script (tests/integration/frameworks/): the JSON line it printed last."""
    probe = await asyncio.create_subprocess_exec(
        *argv,
        env=quiet_env(home),
        cwd=home,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(probe.communicate(), timeout=180)
    assert probe.returncode == 0, (out + err).decode()
    read: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    return read


@pytest.mark.usefixtures("frameworks")
@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_browser_use_connects_navigates_and_reads_the_page(
    sb: Session, upstream: Upstream, runtime: DockerHarness, tmp_path: Path, scheme: str
) -> None:
    cdp_url = sb.cdp_url if scheme == "http" else sb.cdp_url.replace("http://", "ws://")
    page = f"https://allowed.test/frameworks/browser-use-{scheme}"
    read = await run_probe(str(BROWSER_USE_PYTHON), str(BROWSER_USE_PROBE), cdp_url, sb.token, page, home=tmp_path)
    assert read["url"] == page and read["title"] == "upstream allowed.test"
    assert read["text"].split() == ["allowed.test", f"/frameworks/browser-use-{scheme}"]
    # browser-use's own view of the page (what its agent would be given) holds the page's text.
    assert f"/frameworks/browser-use-{scheme}" in read["dom"]
    assert f"/frameworks/browser-use-{scheme}" in [hit.get("path") for hit in upstream.hits(runtime)]


# docs/cdp.md's Puppeteer forms: 25.x (Node 22) with browserURL; 24.x, what npm installs on Node 20,
# with browserWSEndpoint (its browserURL drops the path: 0395); each with the header or a ticket.
PUPPETEER_FORMS = {
    "25-browserURL": ("puppeteer-core", "http", True),
    "25-browserWSEndpoint": ("puppeteer-core", "ws", True),
    "24-browserWSEndpoint": ("puppeteer-core-24", "ws", True),
    "24-ticket": ("puppeteer-core-24", "ws", False),
}


@pytest.mark.usefixtures("frameworks")
@pytest.mark.parametrize("form", list(PUPPETEER_FORMS))
async def test_puppeteer_connects_with_the_token_header_and_reads_the_page(
    sb: Session, upstream: Upstream, runtime: DockerHarness, tmp_path: Path, form: str
) -> None:
    module, scheme, header = PUPPETEER_FORMS[form]
    page = f"https://allowed.test/frameworks/puppeteer-{form}"
    if header:
        endpoint, token = sb.cdp_url if scheme == "http" else sb.cdp_url.replace("http://", "ws://"), sb.token
    else:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {sb.token}"}) as http:
            made = (await http.post(f"{sb.cdp_url}/connect", json={"ttl_s": 60})).json()
        endpoint, token = made["url"], ""
    read = await run_probe("node", str(PUPPETEER_PROBE), endpoint, token, page, module, home=tmp_path)
    assert (read["url"], read["status"], read["title"]) == (page, 200, "upstream allowed.test")
    assert read["text"].split() == ["allowed.test", f"/frameworks/puppeteer-{form}"]
    assert read["version"].startswith(("Chrome/", "HeadlessChrome/"))
    assert f"/frameworks/puppeteer-{form}" in [hit.get("path") for hit in upstream.hits(runtime)]
    # The agent's own browser, which Puppeteer's disconnect left running.
    assert page in [tab.url for tab in await sb.sandbox.tabs()]


@pytest.mark.usefixtures("frameworks")
async def test_puppeteer_24s_browser_url_asks_the_hosts_root_and_gets_a_404(sb: Session, tmp_path: Path) -> None:
    """Why docs/cdp.md gives 24.x browserWSEndpoint: its browserURL drops the session's path."""
    probe = await asyncio.create_subprocess_exec(
        "node",
        str(PUPPETEER_PROBE),
        sb.cdp_url,
        sb.token,
        "https://allowed.test/",
        "puppeteer-core-24",
        env=quiet_env(tmp_path),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(probe.communicate(), timeout=60)
    assert probe.returncode != 0
    root = sb.cdp_url.split("/v1/")[0]
    assert f"Failed to fetch browser webSocket URL from {root}/json/version: HTTP Not Found" in err.decode()


@pytest.mark.usefixtures("frameworks")
async def test_playwright_mcp_on_an_exclusive_connection_holds_the_lease_while_it_is_open(
    sb: Session, tmp_path: Path
) -> None:
    endpoint = sb.cdp_url.replace("http://", "ws://") + "?exclusive=1"
    page = "https://allowed.test/frameworks/exclusive"
    async with playwright_mcp(endpoint, sb.header, home=tmp_path) as client:
        await text_of(client, "browser_navigate", url=page)
        with pytest.raises(ActionFailed) as refused:
            await sb.sandbox.act({"type": "page_info"})
        assert refused.value.error["code"] == "control_taken", refused.value.error
        assert refused.value.error["holder"].startswith("cdp:cdp_")
        assert "/frameworks/exclusive" in await text_of(client, "browser_snapshot")
    # Playwright MCP has gone and its connection with it: the lease is the agent's again.
    reply = await sb.sandbox.act({"type": "tabs"}, wait_for_control_ms=10_000)
    assert page in [tab["url"] for tab in reply["result"]["tabs"]]


# Closing: each client closes what it opened, then every page left (the last one: Chromium quits with
# it, so Corral opens a blank tab first), then the browser (its connection ends, Chromium stays: record
# 0381). Each step must return; the bound is a guard against a hang (Playwright's driver once waited
# for ever on a refused close), not a timing budget.
STEP_LIMIT_S = 10.0


async def step_s(name: str, run: Any) -> float:
    """How long ``run`` (an awaitable) took, failing past STEP_LIMIT_S (printed: the note's table)."""
    started = time.monotonic()
    await asyncio.wait_for(run, STEP_LIMIT_S)
    took = time.monotonic() - started
    print(f"{name}: {took * 1000:.0f} ms")
    return took


async def browser_answers(sb: Session, page: str) -> None:
    """The session's browser, after a client closed everything: a native navigate and screenshot."""
    navigated = await sb.sandbox.navigate(page)
    assert navigated.title == "upstream allowed.test", navigated
    assert (await sb.sandbox.screenshot()).startswith(b"\x89PNG")


def probe_steps(read: dict[str, Any]) -> list[str]:
    """A probe's close steps, each checked: it returned, without error, within STEP_LIMIT_S."""
    print(read["steps"])
    for step in read["steps"]:
        assert "error" not in step and step["ms"] < STEP_LIMIT_S * 1000, read
    return [str(step["step"]) for step in read["steps"]]


async def test_playwright_closes_what_it_opened_the_last_page_and_the_browser(sb: Session) -> None:
    page = "https://allowed.test/frameworks/playwright-close"
    async with async_playwright() as p:
        browser = await p.chromium.connect_over_cdp(sb.cdp_url, headers={"Authorization": f"Bearer {sb.token}"})
        context = browser.contexts[0]
        opened = await context.new_page()
        await opened.goto(page)
        await step_s("playwright close_opened", opened.close())
        left = list(context.pages)
        assert left, "the session's own page is still there"
        for each in left:
            await step_s("playwright close_page", each.close())  # the last of them too
        await step_s("playwright close_browser", browser.close())
    await browser_answers(sb, page)


@pytest.mark.usefixtures("frameworks")
async def test_puppeteer_closes_what_it_opened_the_last_page_and_the_browser(sb: Session, tmp_path: Path) -> None:
    page = "https://allowed.test/frameworks/puppeteer-close"
    read = await run_probe("node", str(PUPPETEER_PROBE), sb.cdp_url, sb.token, page, "close", home=tmp_path)
    steps = probe_steps(read)
    assert steps == ["close_opened", *["close_page"] * read["pages_left"], "close_browser"] and read["pages_left"]
    assert read["connected"] is False  # browser.close() ended Puppeteer's connection
    await browser_answers(sb, page)


@pytest.mark.usefixtures("frameworks")
async def test_browser_use_closes_what_it_opened_the_last_page_and_the_browser(sb: Session, tmp_path: Path) -> None:
    page = "https://allowed.test/frameworks/browser-use-close"
    probe = (str(BROWSER_USE_PYTHON), str(BROWSER_USE_PROBE), sb.cdp_url, sb.token, page, "close")
    read = await run_probe(*probe, home=tmp_path)
    assert probe_steps(read) == ["close_opened", *["close_page"] * read["pages_left"], "close_browser"]
    assert read["pages_left"]
    await browser_answers(sb, page)


@pytest.mark.usefixtures("frameworks")
async def test_playwright_mcp_closes_its_tab_the_last_tab_and_the_browser(sb: Session, tmp_path: Path) -> None:
    page = "https://allowed.test/frameworks/playwright-mcp-close"
    async with playwright_mcp(sb.cdp_url, sb.header, home=tmp_path) as client:
        await text_of(client, "browser_tabs", action="new", url=page)
        listed = await text_of(client, "browser_tabs", action="list")
        count = listed.count("- ")
        assert count >= 2 and page in listed, listed
        await step_s(
            "mcp close_opened", text_of(client, "browser_tabs", action="close", index=count - 1)
        )  # the one it opened
        for index in reversed(range(count - 1)):
            await step_s(
                "mcp close_page", text_of(client, "browser_tabs", action="close", index=index)
            )  # the last one too
        await step_s("mcp close_browser", text_of(client, "browser_close"))
    await browser_answers(sb, page)


# Screenshots of a tab behind another: headful Chromium draws no frame for it, so Page.captureScreenshot
# waited for ever (Playwright: "Timeout exceeded ... fonts loaded"; the window's switches that keep
# background tabs rendering did not change that, measured in record 0382). Corral's relay brings the
# tab to the front first. The back tab is the bank page: its red box (#c80000) is in the picture.
BANK = "https://allowed.test/page/bank.html"
BANK_RED = (200, 0, 0)


async def test_playwright_screenshots_a_tab_behind_another(sb: Session) -> None:
    async with async_playwright() as p:
        browser = await p.chromium.connect_over_cdp(sb.cdp_url, headers={"Authorization": f"Bearer {sb.token}"})
        context = browser.contexts[0]
        back = await context.new_page()
        await back.goto(BANK)
        front = await context.new_page()  # opened in front of the bank
        await front.goto("https://allowed.test/frameworks/front")
        png = await asyncio.wait_for(back.screenshot(timeout=10_000), STEP_LIMIT_S + 5)
        find_color(decode_image(base64.b64encode(png).decode()), BANK_RED)
        # What a person watching sees (the screen, as the native screenshot takes it): that tab, in front.
        find_color(decode_image(base64.b64encode(await sb.sandbox.screenshot()).decode()), BANK_RED)
        await front.close()
        await back.close()
        await browser.close()


@pytest.mark.usefixtures("frameworks")
async def test_playwright_mcp_screenshots_its_tab_after_another_came_in_front(sb: Session, tmp_path: Path) -> None:
    async with playwright_mcp(sb.cdp_url, sb.header, home=tmp_path) as client:
        await text_of(client, "browser_tabs", action="new", url=BANK)  # Playwright MCP's current tab
        await sb.sandbox.tab_new("https://allowed.test/frameworks/agent-in-front")  # the agent's, in front of it
        result = await asyncio.wait_for(client.call_tool("browser_take_screenshot", {}), STEP_LIMIT_S + 5)
        assert isinstance(result, CallToolResult) and not result.is_error, result
        [image] = [block for block in result.content if isinstance(block, ImageContent)]
        find_color(decode_image(image.data), BANK_RED)


def test_the_frameworks_are_pinned() -> None:
    """What CI installs is what the lock says: exact versions, no ranges."""
    package = json.loads((FRAMEWORKS / "package.json").read_text())
    # An exact version, or an alias of one (npm:puppeteer-core@24.43.0).
    assert all(version.rpartition("@")[2][0].isdigit() for version in package["dependencies"].values()), package
    assert all("^" not in version and "~" not in version for version in package["dependencies"].values()), package
    lines = (FRAMEWORKS / "requirements-browser-use.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins and all("==" in line for line in pins), pins
