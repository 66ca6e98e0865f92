"""The container itself: readiness, hardening, loopback-only DevTools, Chromium restarts."""

from __future__ import annotations

import json
import time
import urllib.request

from corral.client import SandboxClient
from corral.runtime.docker import DockerRuntime, SandboxContainer

from .conftest import html_url


def test_healthz_reports_screen_and_browser(sandbox: SandboxContainer) -> None:
    with urllib.request.urlopen(f"{sandbox.base_url}/healthz", timeout=10) as response:
        body = json.loads(response.read())
    assert response.status == 200
    assert body["ok"] is True and body["screen"] == "1280x800"
    assert body["browser"] in ("connected", "up")  # "up": DevTools answer, the Playwright link is still forming


def test_processes_run_as_the_unprivileged_user(runtime: DockerRuntime, sandbox: SandboxContainer) -> None:
    code, out = runtime.exec(sandbox.id, ["ps", "-eo", "user:20,comm", "--no-headers"])
    assert code == 0
    users = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert users == {"corral"}, out
    _, out = runtime.exec(sandbox.id, ["sh", "-c", "grep CapEff /proc/self/status"])
    assert out.split()[-1] == "0000000000000000"


def test_devtools_listens_on_loopback_only(runtime: DockerRuntime, sandbox: SandboxContainer) -> None:
    _, out = runtime.exec(sandbox.id, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
    listening = [line.split() for line in out.splitlines()[1:] if line.split()[3:4] == ["0A"]]
    cdp = [fields[1] for fields in listening if fields[1].endswith(":2406")]  # port 9222
    assert cdp, out
    assert all(addr.split(":")[0] in ("0100007F", "00000000000000000000000001000000") for addr in cdp), cdp
    # Only the controller's port is published, and only on the host's loopback.
    assert sandbox.host == "127.0.0.1"


def test_chromium_is_restarted_and_browser_actions_recover(
    runtime: DockerRuntime, spare_sandbox: SandboxContainer
) -> None:
    with SandboxClient(spare_sandbox.ws_url) as client:
        assert client.act({"type": "navigate", "url": html_url("<p>x</p>", "document.title='before'")})["ok"]
        runtime.kill_process(spare_sandbox.id, "chromium")
        deadline = time.monotonic() + 60
        while True:
            reply = client.request(
                {"action": {"type": "navigate", "url": html_url("<p>y</p>", "document.title='after'")}}
            )
            if reply["ok"]:
                break
            assert reply["error"]["code"] in ("browser_unavailable", "navigation_failed"), reply
            assert time.monotonic() < deadline, "Chromium did not come back"
            time.sleep(0.2)
        assert reply["result"]["title"] == "after"
        # Input and screenshots never depended on the browser and kept working.
        assert client.act({"type": "screenshot", "format": "jpeg"})["screenshot"]["width"] == 1280
    assert "restarting" in runtime.logs(spare_sandbox.id, 500)
