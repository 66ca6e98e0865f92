"""The client commands the docs give, run as written on the Node this machine has (20), at the versions
the docs name: the MCP Inspector's CLI (docs/mcp.md, pinned 0.21.2) over Streamable HTTP and over
stdio (``corral mcp``) against a real gateway. The frameworks' own documented forms (Playwright,
Puppeteer 25 and 24, browser-use, Playwright MCP) run in test_cdp.py and test_cdp_frameworks.py;
here, that the versions the docs name are the ones pinned."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.mcp import ANNOTATIONS

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = Path(__file__).parent / "frameworks"
DOCS = ROOT / "docs"
SERVICES = str(ROOT / "services")


def pinned() -> dict[str, str]:
    """package.json's pins, an npm alias (``npm:puppeteer-core@24.43.0``) as its version."""
    dependencies: dict[str, str] = json.loads((FRAMEWORKS / "package.json").read_text())["dependencies"]
    return {name: version.rpartition("@")[2] for name, version in dependencies.items()}


def inspector_prefix() -> list[str]:
    """docs/mcp.md's ``I="npx ... --cli"``, as the doc writes it."""
    found = re.search(r'^\$ I="(npx [^"]+)"$', (DOCS / "mcp.md").read_text(), re.MULTILINE)
    assert found, "docs/mcp.md gives no Inspector command"
    return shlex.split(found.group(1))


def test_the_documented_versions_are_the_pinned_ones() -> None:
    pins = pinned()
    assert inspector_prefix() == [
        "npx",
        f"@modelcontextprotocol/inspector@{pins['@modelcontextprotocol/inspector']}",
        "--cli",
    ]
    cdp = (DOCS / "cdp.md").read_text()
    assert f"tested at {pins['puppeteer-core']} and at {pins['puppeteer-core-24']}" in cdp
    assert f"tested at\n{pins['@playwright/mcp']}" in cdp or f"tested at {pins['@playwright/mcp']}" in cdp
    browser_use = (FRAMEWORKS / "requirements-browser-use.txt").read_text()
    version = re.search(r"^browser-use==(\S+)$", browser_use, re.MULTILINE)
    assert version and f"tested at {version.group(1)}" in cdp
    from importlib.metadata import version as installed

    assert f"tested at {installed('playwright')}" in cdp


@pytest.fixture(scope="module")
def frameworks() -> None:
    """The pinned npm packages (the Inspector among them), installed (a no-op when they already are)."""
    subprocess.run([str(ROOT / "scripts" / "bootstrap-frameworks")], check=True, timeout=600)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-docclients") as running:
        yield running


def inspector(*arguments: str, home: Path) -> dict[str, Any]:
    """The documented Inspector command with ``arguments``, from the frameworks' directory (npx finds the
    pinned install there; npm is told to stay offline), its JSON answer."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # `corral` for the stdio form
        "HOME": str(home),
        "npm_config_offline": "true",
        "npm_config_update_notifier": "false",
    }
    ran = subprocess.run(
        [*inspector_prefix(), *arguments], cwd=FRAMEWORKS, env=env, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-2000:])
    answer: dict[str, Any] = json.loads(ran.stdout)
    return answer


@pytest.mark.usefixtures("frameworks")
def test_the_inspector_over_streamable_http_as_documented(gw: RunningGateway, tmp_path: Path) -> None:
    http = [f"{gw.url}/mcp", "--transport", "http", "--header", f"Authorization: Bearer {KEY_A}"]
    listed = inspector(*http, "--method", "tools/list", home=tmp_path)
    assert [tool["name"] for tool in listed["tools"]] == list(ANNOTATIONS)
    assert all(tool.get("annotations") for tool in listed["tools"])

    def call(tool: str, *arguments: str) -> dict[str, Any]:
        args = [arg for argument in arguments for arg in ("--tool-arg", argument)]
        return inspector(*http, "--method", "tools/call", "--tool-name", tool, *args, home=tmp_path)

    made = call("create_session", 'allow=["example.test"]')
    session_id = made["structuredContent"]["id"]
    assert made["content"][0]["text"] == f"session {session_id} is ready"
    try:
        ran = call("exec", f"session_id={session_id}", "command=id -un")
        assert ran["structuredContent"]["exit_code"] == 0 and ran["structuredContent"]["stdout"] == "agent\n"
        refused = call("press_key", f"session_id={session_id}", "keys=Return")
        assert refused["isError"] is True
        assert refused["structuredContent"]["error"]["message"] == (
            "press_key has no argument keys (did you mean key?); key is required"
        )
        pressed = call("press_key", f"session_id={session_id}", "key=Return")
        assert not pressed.get("isError") and [block["type"] for block in pressed["content"]] == ["text", "image"]
    finally:
        ended = call("end_session", f"session_id={session_id}")
    assert ended["structuredContent"] == {"id": session_id, "ended": True}


@pytest.mark.usefixtures("frameworks")
def test_the_inspector_over_stdio_runs_corral_mcp_as_documented(gw: RunningGateway, tmp_path: Path) -> None:
    settings = ["-e", f"CORRAL_URL={gw.url}", "-e", f"CORRAL_API_KEY={KEY_A}", "-e", f"PYTHONPATH={SERVICES}"]
    listed = inspector(*settings, "corral", "mcp", "--method", "tools/list", home=tmp_path)
    assert [tool["name"] for tool in listed["tools"]] == list(ANNOTATIONS)
    sessions = inspector(
        *settings, "corral", "mcp", "--method", "tools/call", "--tool-name", "list_sessions", home=tmp_path
    )
    assert sessions["structuredContent"] == {"sessions": []}
