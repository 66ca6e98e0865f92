"""The sandbox's own browser opens a preview's address through the controller's door on the sandbox's
loopback (corral.sandbox.previewdoor), against the real image and a real gateway with egress control
on: the page and a WebSocket echo of a server the agent runs; and, played as the agent's uid, the door
never reaches the controller, DevTools or a server of another uid."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway
from .preview_fixtures import WAIT_LISTENING

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

APP = (Path(__file__).parent / "preview_apps" / "app.py").read_text()
PORTS = (3000, 3001)

# Run by the agent: each Host asked of the door on 127.0.0.1:8701, and the status line it answered.
ASK_DOOR = """
import json, socket, sys
answers = {}
for host in json.loads(sys.argv[1]):
    with socket.create_connection(("127.0.0.1", 8701), timeout=10) as sock:
        sock.sendall(f"GET /json/version HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    answers[host] = data.decode(errors="replace")
print(json.dumps(answers))
"""
# Run by the agent: whether it reaches a port on loopback directly (the firewall's fence, for comparison).
DIRECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    print("reached")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    # Each test gateway has a preview listener on a free port of its own (gateway_fixtures).
    with module_gateway(tmp_path_factory, runtime, "previewclient") as served:
        yield served


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as box:
        box.files.write("/workspace/app.py", APP)
        for port in PORTS:
            box.processes.start(argv=["python3", "/workspace/app.py", str(port)])
        box.exec(argv=["python3", "-c", WAIT_LISTENING, *map(str, PORTS)], timeout_ms=30_000).check()
        yield box


def _hex(box: Sandbox) -> str:
    return box.id.removeprefix("ses_")


def _title_becomes(box: Sandbox, wanted: str, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while (title := box.page_info().title) != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return title


def _ask_door(box: Sandbox, hosts: list[str]) -> dict[str, str]:
    done = box.exec(argv=["python3", "-c", ASK_DOOR, json.dumps(hosts)], timeout_ms=30_000).check()
    answers: dict[str, str] = json.loads(done.stdout)
    return answers


def test_the_sandboxs_browser_opens_the_preview_address(sb: Sandbox) -> None:
    page = sb.navigate(f"http://3000-{_hex(sb)}.localhost:8701/")
    assert page.title == "preview-app 3000"
    other = sb.navigate(f"http://3001-{_hex(sb)}.LOCALHOST:8701/cookie")
    assert other.title == "preview-app 3001"
    # The server saw the preview's own name as its Host, as it does through the gateway.
    assert sb.navigate(f"http://3001-{_hex(sb)}.localhost:8701/").title == "preview-app 3001"


def test_the_sandboxs_browser_reaches_it_directly_not_through_the_proxy(
    sb: Sandbox, gw: RunningGateway, runtime: DockerHarness
) -> None:
    # The session's browser has the proxy set (egress control on), and yet the name went direct.
    code, policy = runtime.exec(sb.container, ["cat", "/run/corral/chromium-policy.json"])
    assert code == 0 and json.loads(policy)["ProxySettings"]["ProxyMode"] == "fixed_servers", policy
    sb.navigate(f"http://3000-{_hex(sb)}.localhost:8701/?proxy-check")
    with gw.client() as c:
        records = [json.loads(line) for line in c.get(f"/v1/sessions/{sb.id}/traffic").text.splitlines() if line]
    assert not [r for r in records if "localhost" in str(r.get("host", ""))], records


def test_a_websocket_echo_from_the_sandboxs_browser(sb: Sandbox) -> None:
    sb.navigate(f"http://3000-{_hex(sb)}.localhost:8701/wspage")
    assert _title_becomes(sb, "ws echo:hi from the page") == "ws echo:hi from the page"


def test_the_agent_cannot_use_the_door_to_reach_the_controller_or_devtools(sb: Sandbox) -> None:
    # The firewall fences these from the agent's uid; the door, which connects as the controller's
    # uid, must not open them either.
    for port in ("9222", "8765"):  # a TCP reset to the SYN: refused
        assert sb.exec(argv=["python3", "-c", DIRECT, port]).stdout.strip() == "ConnectionRefusedError"
    hosts = [f"{port}-{_hex(sb)}.localhost:8701" for port in (8765, 9222, 8701)]
    answers = _ask_door(sb, hosts)
    for host in hosts:
        assert answers[host].startswith("HTTP/1.1 403 Forbidden"), answers[host]
        assert "reserved" in answers[host] and "webSocketDebuggerUrl" not in answers[host]


def test_a_server_of_another_uid_is_never_lent(sb: Sandbox, runtime: DockerHarness) -> None:
    # A server of the controller's uid on loopback (as a helper of the controller's would be): the
    # agent could not reach it as itself only if the firewall fenced it; the door refuses it whatever.
    serve = "python3 -m http.server 3100 --bind 127.0.0.1 >/dev/null 2>&1 &"
    code, output = runtime.exec(sb.container, ["sh", "-c", serve], user="corral")
    assert code == 0, output
    sb.exec(argv=["python3", "-c", WAIT_LISTENING, "3100"], timeout_ms=30_000).check()
    answers = _ask_door(sb, [f"3100-{_hex(sb)}.localhost:8701"])
    assert next(iter(answers.values())).startswith("HTTP/1.1 403 Forbidden")
    assert "not the agent's server" in next(iter(answers.values()))


def test_a_preview_from_outside_never_reaches_a_server_of_another_uid(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    # The same rule on the gateway's way in (the controller's tunnel connects as itself too): a
    # preview of a port the controller's uid listens on is refused before any connection.
    serve = "python3 -m http.server 3101 --bind 127.0.0.1 >/dev/null 2>&1 &"
    code, output = runtime.exec(sb.container, ["sh", "-c", serve], user="corral")
    assert code == 0, output
    sb.exec(argv=["python3", "-c", WAIT_LISTENING, "3101"], timeout_ms=30_000).check()
    preview = sb.previews.create(3101)
    secret = preview.url.split("corral_preview_token=", 1)[1]
    headers = {"host": f"{preview.host}:{gw.settings.preview_port}", "x-corral-preview-token": secret}
    with httpx.Client(base_url=f"http://127.0.0.1:{gw.settings.preview_port}", headers=headers, timeout=30) as c:
        answer = c.get("/")
    assert answer.status_code == 502, answer.text
    assert "port 3101 is not the agent's server" in answer.json()["error"]["message"]
    assert "Directory listing" not in answer.text


def test_nothing_listening_and_no_preview_name_are_clear_answers(sb: Sandbox) -> None:
    hosts = [f"3999-{_hex(sb)}.localhost:8701", "localhost:8701", f"3000-{_hex(sb)}.example.test"]
    answers = _ask_door(sb, hosts)
    assert answers[hosts[0]].startswith("HTTP/1.1 502 Bad Gateway") and "port 3999" in answers[hosts[0]]
    assert answers[hosts[1]].startswith("HTTP/1.1 404 Not Found")
    assert answers[hosts[2]].startswith("HTTP/1.1 404 Not Found")
    # The session goes on.
    assert sb.navigate(f"http://3000-{_hex(sb)}.localhost:8701/").title == "preview-app 3000"
