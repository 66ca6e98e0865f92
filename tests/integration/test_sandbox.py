"""The container itself: readiness, hardening, loopback-only DevTools, Chromium restarts."""

from __future__ import annotations

import json
import time
import urllib.request

from corral.client import SandboxClient
from corral.runtime import SandboxAddress

from .conftest import html_url
from .dockerutil import DockerHarness


def test_healthz_reports_screen_and_browser(sandbox: SandboxAddress) -> None:
    with urllib.request.urlopen(f"{sandbox.base_url}/healthz", timeout=10) as response:
        body = json.loads(response.read())
    assert response.status == 200
    assert body["ok"] is True and body["screen"] == "1280x800"
    assert body["browser"] in ("connected", "up")  # "up": DevTools answer, the Playwright link is still forming


SUPERVISOR_CAPS = f"{(1 << 6) | (1 << 7) | (1 << 8):016x}"  # CAP_SETGID, CAP_SETUID, CAP_SETPCAP
LAUNCHER_CAPS = f"{(1 << 6) | (1 << 7):016x}"  # CAP_SETGID, CAP_SETUID: acting as the agent, nothing more


def test_processes_run_as_three_unprivileged_users(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    code, out = runtime.exec(sandbox.id, ["ps", "-eo", "pid,user:20,ni,comm", "--no-headers"], user="root")
    assert code == 0
    table = [line.split(None, 3) for line in out.splitlines() if line.strip() and not line.split()[3].startswith("ps")]
    rows = [[pid, user, comm] for pid, user, _, comm in table]
    users = {comm: user for _, user, comm in rows}
    # The controller, Xvfb and the supervisor as corral; the browser and the window manager as browser
    # (a uid of their own); the agent's uid runs only what the agent starts (another test's, if any).
    assert users["Xvfb"] == "corral" and users["tini"] == "corral", out
    assert users["chromium"] == "browser" and users["openbox"] == "browser", out
    assert {"corral", "browser"} <= {user for _, user, _ in rows} <= {"corral", "agent", "browser"}, out
    # Nothing of the sandbox's own is niced. The agent's processes are (nice 10), and a spare shepherd has
    # niced itself for the agent already: another test's agent shell may still run in this shared sandbox
    # (the modules before this one on its worker are any of the suite's).
    shepherds = set(_launchers(runtime, sandbox))
    assert {nice for pid, user, nice, _ in table if pid not in shepherds and user != "agent"} == {"0"}, out
    for pid, _, comm in rows:
        found, status = runtime.exec(sandbox.id, ["grep", "CapEff", f"/proc/{pid}/status"], user="root")
        if found != 0 or not status.strip():
            continue  # gone meanwhile (grep's "No such file or directory": a live process always has CapEff)
        caps = status.split()[-1]
        if comm == "python" and caps == LAUNCHER_CAPS:
            # The launcher (and its shepherds, forks of it) act as the agent for the controller.
            assert pid in _launchers(runtime, sandbox), (pid, comm)
        elif comm in ("tini", "python") and caps != "0000000000000000":
            # Only pid 1 and the supervisor keep what starting children as another uid needs.
            assert caps == SUPERVISOR_CAPS and pid in (_pid(rows, "tini"), _supervisor(runtime, sandbox)), (pid, comm)
        else:
            assert caps == "0000000000000000", (pid, comm, caps)
    _, out = runtime.exec(sandbox.id, ["sh", "-c", "grep CapEff /proc/self/status"], user="agent")
    assert out.split()[-1] == "0000000000000000"


def _pid(rows: list[list[str]], comm: str) -> str:
    return next(pid for pid, _, name in rows if name == comm)


def _supervisor(runtime: DockerHarness, sandbox: SandboxAddress) -> str:
    _, out = runtime.exec(sandbox.id, ["pgrep", "-f", "corral.sandbox.startup.init"], user="root")
    return next(pid for pid in out.split() if pid != "1")


def _launchers(runtime: DockerHarness, sandbox: SandboxAddress) -> list[str]:
    _, out = runtime.exec(
        sandbox.id, ["pgrep", "-f", "-x", "/opt/corral/bin/python -P -m corral.sandbox.agent.launcher"], "root"
    )
    return out.split()


def test_devtools_listens_on_loopback_only(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    _, out = runtime.exec(sandbox.id, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
    listening = [line.split() for line in out.splitlines()[1:] if line.split()[3:4] == ["0A"]]
    cdp = [fields[1] for fields in listening if fields[1].endswith(":2406")]  # port 9222
    assert cdp, out
    assert all(addr.split(":")[0] in ("0100007F", "00000000000000000000000001000000") for addr in cdp), cdp
    # Only the controller's port is published, and only on the host's loopback.
    assert sandbox.host == "127.0.0.1"


def test_chromium_is_restarted_and_browser_actions_recover(
    runtime: DockerHarness, spare_sandbox: SandboxAddress
) -> None:
    with SandboxClient(spare_sandbox.ws_url, controller_secret=spare_sandbox.secret) as client:
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
