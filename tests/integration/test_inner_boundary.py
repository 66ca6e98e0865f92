"""The boundary inside the sandbox, attacked for real: a hostile page served by the fake upstream
through the session's proxy (enforce mode), and processes run as the sandbox's agent uid. Neither
may drive, read or impersonate the controller."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.client import SandboxClient
from corral.contracts import auth
from corral.errors import ActionFailed, SandboxError, UnprovenController
from corral.runtime import SandboxAddress, SandboxSpec
from corral.sdk import Sandbox

from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

# Run as the agent's uid inside the sandbox: everything a compromised renderer or an agent's command
# might try against the controller's processes. Prints one JSON object.
AGAINST_THE_CONTROLLER = r"""
import ctypes, json, os, signal, socket, sys
controller = int(sys.argv[1])
control_port = int(sys.argv[2])
seen = {"uid": os.getuid()}
def attempt(name, fn):
    try:
        fn(); seen[name] = "done"
    except OSError as exc:
        seen[name] = type(exc).__name__
attempt("kill", lambda: os.kill(controller, signal.SIGKILL))
attempt("stop", lambda: os.kill(controller, signal.SIGSTOP))
attempt("environ", lambda: open(f"/proc/{controller}/environ", "rb").read())
attempt("mem", lambda: open(f"/proc/{controller}/mem", "rb").read(1))
attempt("secret", lambda: open("/run/corral/controller/secret").read())
attempt("secret_dir", lambda: os.listdir("/run/corral/controller"))
attempt("proxy_token", lambda: open("/run/corral-secrets/proxy-token").read())
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
seen["ptrace"] = "done" if libc.ptrace(PTRACE_ATTACH, controller, 0, 0) == 0 else os.strerror(ctypes.get_errno())
def connect(host, port):
    socket.create_connection((host, port), timeout=2).close()
for port in (8765, 9222):
    attempt(f"connect {port}", lambda port=port: connect("127.0.0.1", port))
if control_port:
    attempt("connect control", lambda: connect("corral-proxy", control_port))
print(json.dumps(seen))
"""

# Wait for the controller's port to be free (the controller crashed), take it and answer anything with
# a forged success, HTTP or WebSocket, for ``hold`` seconds.
IMPOSTOR = r"""
import base64, hashlib, socket, sys, time
hold = float(sys.argv[1])
forged = b'{"ok":true,"id":1,"result":{"text":"forged-by-impostor"}}'
deadline = time.monotonic() + 20
while True:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old connections' TIME_WAIT
    try:
        s.bind(("0.0.0.0", 8765)); break
    except OSError:
        s.close()
        if time.monotonic() > deadline: sys.exit("never got the port")
        time.sleep(0.005)
s.listen(16); s.settimeout(0.2)
print("BOUND", flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    try: conn, _ = s.accept()
    except OSError: continue
    request = conn.recv(65536)
    key = [l.split(b":", 1)[1].strip() for l in request.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")]
    if key:
        accept = base64.b64encode(hashlib.sha1(key[0] + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                     b"sec-websocket-accept: " + accept + b"\r\n\r\n" + bytes([0x81, len(forged)]) + forged)
        time.sleep(0.5)
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(forged), forged))
    conn.close()
"""


# Run as the agent: listen on DevTools' port (and, to compare, the next one) on a loopback address
# Chromium leaves free, answering any request as DevTools would, for ``hold`` seconds.
FAKE_DEVTOOLS = r"""
import socket, sys, threading, time
hold = float(sys.argv[1])
body = b'{"Browser": "forged-by-the-agent", "webSocketDebuggerUrl": "ws://127.0.0.1:8765/v1/ws"}'
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.2", port)); s.listen(8); s.settimeout(0.2)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        try: conn, _ = s.accept()
        except OSError: continue
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)); conn.close()
threads = [threading.Thread(target=serve, args=(port,)) for port in (9222, 9223)]
[t.start() for t in threads]
print("LISTENING", flush=True)
[t.join() for t in threads]
"""

# Run as the controller's uid: what DevTools' address answers, as the controller would ask it.
ASK_DEVTOOLS = r"""
import socket, sys
try:
    with socket.create_connection(("127.0.0.2", int(sys.argv[1])), timeout=3) as s:
        s.sendall(b"GET /json/version HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        print(s.recv(65536).decode() or "closed")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-ib-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("inner-gw"), f"inner-{os.getpid()}") as running:
        yield running


def loopback_refused(sb: Sandbox, page: str) -> dict[str, str]:
    """What a hostile page (upstream/pages/attack-*.html) reported in its title, once it has checked that
    every spelling of loopback refused it: the connection itself (the agent's uid may not connect)."""
    sb.navigate(page)
    title = wait_for(lambda: (t := str(sb.page_info().title)).startswith("done") and t, timeout_s=40)
    assert title, sb.page_info()
    seen: dict[str, str] = json.loads(title.removeprefix("done "))
    for host in ("127.0.0.1", "localhost", "[::1]"):
        assert seen[f"fetch {host}"] == "failed", seen
        assert not seen[f"ws {host}"].startswith("message"), seen
    return seen


def _pid(runtime: DockerHarness, container: str, pattern: str) -> int:
    code, out = runtime.exec(container, ["pgrep", "-f", pattern], user="root")
    assert code == 0, out
    return int(out.split()[0])


def test_a_hostile_page_can_neither_drive_nor_read_the_controller(gw: RunningGateway, upstream: Upstream) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        with gw.client() as c:
            assert c.get(f"/v1/sessions/{sb.id}").json()["egress_mode"] == "enforce"
        sb.act({"type": "clipboard_set", "text": "the agent's own"})
        seen = loopback_refused(sb, "https://allowed.test/page/attack-controller.html")
        for read in ("recording", "devtools", "healthz"):
            assert seen[read] == "failed", seen
        # Nothing ran: the clipboard holds what the agent put there, and the recording shows only
        # the agent's own requests.
        assert sb.act({"type": "clipboard_get"})["result"]["text"] == "the agent's own"
        with gw.client() as c:
            events = c.get(f"/v1/sessions/{sb.id}/recording/events").json()["events"]
        assert "pwned-by-page" not in json.dumps(events)
        kinds = [step["type"] for e in events for step in e.get("native") or []]
        assert kinds.count("clipboard_set") == 1 and set(kinds) <= {
            "clipboard_set",
            "navigate",
            "page_info",
            "clipboard_get",
        }, kinds


def test_the_agent_uid_cannot_touch_the_controllers_processes_or_secrets(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        box = sb.container
        controller = _pid(runtime, box, "corral.sandbox.controller")
        code, out = runtime.exec(box, ["python", "-c", AGAINST_THE_CONTROLLER, str(controller), "8081"], user="agent")
        assert code == 0, out
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen["uid"] == 1100
        for attempt in ("kill", "stop", "environ", "mem", "secret", "secret_dir", "proxy_token"):
            assert seen[attempt] == "PermissionError", seen
        assert seen["ptrace"] == os.strerror(1), seen  # EPERM
        for port in ("connect 8765", "connect 9222", "connect control"):
            assert seen[port] == "ConnectionRefusedError", seen
        # The controller lived through all of it.
        assert _pid(runtime, box, "corral.sandbox.controller") == controller
        assert sb.act({"type": "cursor_position"})["ok"] is True
        # No secret in any process's environment: not in the controller's, not in what the agent sees.
        code, out = runtime.exec(box, ["sh", "-c", "cat /proc/[0-9]*/environ | tr '\\0' '\\n'"], user="root")
        assert "CORRAL_CONTROLLER_TOKEN" not in out
        code, secret = runtime.exec(box, ["cat", str(auth.SECRET_FILE)], user="corral")
        assert code == 0 and secret.strip() not in out


def test_an_impostor_on_the_controllers_port_never_answers_the_agent(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        box = sb.container
        outputs: list[str] = []
        impostor = threading.Thread(
            target=lambda: outputs.append(runtime.exec(box, ["python", "-c", IMPOSTOR, "12"], user="agent")[1])
        )
        impostor.start()
        try:
            # The controller crashes; the agent's process takes its port before it comes back.
            runtime.exec(box, ["pkill", "-KILL", "-f", "corral.sandbox.controller"], user="corral")
            with gw.client() as c:
                response = c.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "clipboard_get"}})
            assert response.status_code == 502 and "forged" not in response.text, response.text
            assert response.json()["error"]["code"] == "sandbox_unreachable"
        finally:
            impostor.join(30)
        assert outputs and "BOUND" in outputs[0], outputs  # it did hold the port
        # The impostor gone, the supervisor's controller comes back and the session carries on.
        assert wait_for(lambda: _http_ok(gw, sb.id), timeout_s=30)


def _http_ok(gw: RunningGateway, session_id: str) -> bool:
    with gw.client() as c:
        response = c.post(f"/v1/sessions/{session_id}/actions", json={"action": {"type": "cursor_position"}})
    return response.status_code == 200


def test_what_cannot_prove_the_secret_is_not_believed(runtime: DockerHarness, desktop_image: str) -> None:
    """Even past the firewall (here root, which the agent never is, answers on the port), the caller
    believes nothing without the controller's proof."""
    sandbox = runtime.start_sandbox(
        SandboxSpec(image=desktop_image, name=f"corral-it-proof-{os.getpid()}", labels={"corral.test": "1"})
    )
    try:
        runtime.wait_ready(sandbox, 90)
        runtime.exec(sandbox.id, ["pkill", "-STOP", "-f", "corral.sandbox.startup.init"], user="corral")  # no restarts
        runtime.exec(sandbox.id, ["pkill", "-KILL", "-f", "corral.sandbox.controller"], user="corral")
        thread = threading.Thread(
            target=runtime.exec, args=(sandbox.id, ["python", "-c", IMPOSTOR, "8"]), kwargs={"user": "root"}
        )
        thread.start()
        try:
            with pytest.raises(UnprovenController):
                wait_for(lambda: _connects(sandbox), timeout_s=5)
            # Its health answer is a 200 too, but not the controller's: readiness says so.
            with pytest.raises(SandboxError, match="no controller"):
                runtime.wait_ready(sandbox, 5)
        finally:
            thread.join(20)
    finally:
        runtime.remove(sandbox.id)


def _connects(sandbox: SandboxAddress) -> bool:
    try:
        with SandboxClient(sandbox.ws_url, controller_secret=sandbox.secret):
            return True
    except (OSError, InvalidHandshake, ConnectionClosed):  # nobody on the port yet (Docker's proxy hangs up)
        return False


def test_the_image_runs_on_its_own(runtime: DockerHarness, desktop_image: str) -> None:
    """`docker run --rm corral-desktop:latest`: Docker's defaults, no Corral runtime around it."""
    client = docker.from_env()
    container = client.containers.run(desktop_image, detach=True, auto_remove=True, labels={"corral.test": "1"})
    try:
        status = wait_for(lambda: _health(container), timeout_s=90)
        assert status == "healthy", container.logs(tail=60).decode(errors="replace")
        logs = container.logs().decode(errors="replace")
        assert "PermissionError" not in logs and "Traceback" not in logs, logs[-3000:]
        _, out = container.exec_run(["ps", "-eo", "user:12,comm", "--no-headers"])
        users = {line.split()[1]: line.split()[0] for line in out.decode().splitlines() if line.strip()}
        assert (users["chromium"], users["openbox"], users["Xvfb"]) == ("browser", "browser", "corral"), out
    finally:
        container.remove(force=True)


def _health(container: Any) -> str | None:
    container.reload()
    status = str(((container.attrs.get("State") or {}).get("Health") or {}).get("Status", ""))
    return status if status in ("healthy", "unhealthy") else None


# Planted by the agent in its home, the controller's working directory in the image (WORKDIR): were
# that directory on the path of a Python started there, whatever such a process imports for the first
# time after boot (Playwright's API on the first browser call brings greenlet, stringprep and
# unicodedata) would run the agent's file instead, as that process's uid.
PLANT = r"""
import os, sys
home = os.path.expanduser("~")
os.chmod(home, 0o755)
for name in sys.argv[1:]:
    with open(os.path.join(home, name + ".py"), "w") as planted:
        planted.write(f"import os\nopen('/tmp/hijacked-{name}', 'w').write(str(os.getuid()))\n")
print("planted")
"""


def test_modules_the_agent_plants_in_its_home_are_never_imported_by_the_sandboxs_own_processes(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        box = sb.container
        names = ["greenlet", "stringprep", "unicodedata", "encodings_idna", "linecache", "tokenize"]
        code, out = runtime.exec(box, ["python", "-c", PLANT, *names], user="agent")
        assert code == 0 and "planted" in out, out
        # The first browser call: the controller imports Playwright's API now (a planted greenlet.py
        # found first breaks the driver's start, after the planted code ran).
        failures: list[str] = []
        try:
            sb.navigate("https://allowed.test/")
        except ActionFailed as exc:
            failures.append(str(exc))
        # A child the init restarts starts in the same place: the controller, once killed.
        controller = _pid(runtime, box, "corral.sandbox.controller")
        runtime.exec(box, ["kill", "-KILL", str(controller)], user="corral")
        back = wait_for(lambda: _http_ok(gw, sb.id), timeout_s=30)
        code, out = runtime.exec(box, ["sh", "-c", "ls /tmp/hijacked-* 2>/dev/null; true"], user="root")
        assert out.strip() == "", f"the agent's planted modules ran: {out} ({failures})"
        assert back and not failures, failures
        with gw.client() as c:  # the SDK's socket went with the killed controller; over HTTP
            action = {"type": "navigate", "url": "https://allowed.test/"}
            answer = c.post(f"/v1/sessions/{sb.id}/actions", json={"action": action})
        assert answer.status_code == 200 and answer.json()["ok"] is True, answer.text
        # Every process of the sandbox's own Python (tini's too, which boot execs) runs in /, never in
        # a directory the agent can write. Read from the host: inside, no uid may read another's cwd.
        if os.geteuid() == 0:
            listed = runtime.client.api.top(box, ps_args="-eo pid,args")
            pid_at, args_at = listed["Titles"].index("PID"), listed["Titles"].index("COMMAND")
            ours = [row[pid_at] for row in listed["Processes"] if "corral.sandbox." in row[args_at]]
            places = {pid: os.readlink(f"/proc/{pid}/cwd") for pid in ours}
            assert len(places) >= 4 and set(places.values()) == {"/"}, places


def test_what_answers_on_devtools_port_is_never_the_agent(gw: RunningGateway, runtime: DockerHarness) -> None:
    # Browser reports stay honest: while Chromium (uid browser) is down, a process of the agent's
    # bound to DevTools' port never gets an answer out; the controller believes only Chromium.
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        box = sb.container
        outputs: list[str] = []
        fake = threading.Thread(
            target=lambda: outputs.append(runtime.exec(box, ["python3", "-c", FAKE_DEVTOOLS, "15"], user="agent")[1])
        )
        fake.start()
        try:
            # The same listener answers on the next port: only DevTools' port is closed to it.
            def ask(port: str) -> str:
                return runtime.exec(box, ["python3", "-c", ASK_DEVTOOLS, port])[1]

            assert wait_for(lambda: "forged" in ask("9223")), "the agent's listener never answered on 9223"
            answer = ask("9222")
            assert "forged" not in answer and answer.strip() == "TimeoutError", answer
        finally:
            fake.join(30)
        assert outputs and "LISTENING" in outputs[0], outputs
