"""The agent's programs are untrusted X clients (issue 26, item 2), attacked for real: a process the
agent starts with its own ``exec`` (its own environment, its own XAUTHORITY) tries to inject input
with XTEST, log input with RECORD and read the screen with GetImage; another connects without a
cookie, over the socket file and the abstract socket. A GUI program of the agent's still opens a
window, and the controller's own input, capture and clipboard are unaffected."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from corral.client import SandboxClient
from corral.runtime import SandboxAddress

from .conftest import screenshot_image, wait_for
from .dockerutil import DockerHarness

pytestmark = pytest.mark.usefixtures("desktop_image")

AGENT_UID = 1100
PYTHON = "/opt/corral/bin/python"  # the image's Python with python-xlib, which the agent may run too

# Run by the agent's exec: everything an untrusted client might try. The extensions' opcodes come
# from a trusted client (argv), as an attacker would guess them: the server must refuse them all the same.
AGAINST_THE_X_SERVER = r"""
import json, os, sys
from Xlib import X, XK, display, error
from Xlib.ext import record, xtest
xtest_opcode, record_opcode, presses = map(int, sys.argv[1:4])
seen = {"uid": os.getuid(), "xauthority": os.environ.get("XAUTHORITY")}
d = display.Display()
seen["extensions"] = sorted(d.list_extensions())
keycode = d.keysym_to_keycode(XK.string_to_keysym("x"))
caught = error.CatchError()
for _ in range(presses):
    for kind in (X.KeyPress, X.KeyRelease):
        xtest.FakeInput(display=d.display, onerror=caught, opcode=xtest_opcode, event_type=kind,
                        detail=keycode, time=X.CurrentTime, root=X.NONE, x=0, y=0)
d.sync()
seen["xtest"] = type(caught.get_error()).__name__ if caught.get_error() else "sent"
caught = error.CatchError()
ranges = [{"core_requests": (0, 0), "core_replies": (0, 0), "ext_requests": (0, 0, 0, 0),
           "ext_replies": (0, 0, 0, 0), "delivered_events": (0, 0), "device_events": (X.KeyPress, X.KeyRelease),
           "errors": (0, 0), "client_started": False, "client_died": False}]
record.CreateContext(display=d.display, onerror=caught, opcode=record_opcode, context=d.display.allocate_resource_id(),
                     element_header=0, clients=[record.AllClients], ranges=ranges)
d.sync()
seen["record"] = type(caught.get_error()).__name__ if caught.get_error() else "created"
try:
    pixels = d.screen().root.get_image(0, 0, 64, 64, X.ZPixmap, 0xFFFFFFFF).data
    seen["get_image"] = "read %d distinct bytes" % len(set(pixels))
except error.XError as exc:
    seen["get_image"] = type(exc).__name__
print(json.dumps(seen))
"""

# Run as the agent without any cookie: the X server over its socket file and its abstract socket.
NO_COOKIE = r"""
import json, socket, struct
seen = {}
for name, address in (("file", "/tmp/.X11-unix/X0"), ("abstract", "\0/tmp/.X11-unix/X0")):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)
        s.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, 0, 0))
        seen[name] = {0: "refused", 1: "accepted", 2: "authenticate"}[s.recv(8)[0]]
with open("/proc/net/tcp") as tcp, open("/proc/net/tcp6") as tcp6:
    listening = [l.split()[1] for l in tcp.readlines()[1:] + tcp6.readlines()[1:] if l.split()[3] == "0A"]
seen["x_tcp"] = [a for a in listening if int(a.split(":")[1], 16) in range(6000, 6064)]
for path in ("/run/corral/x11/controller",):
    try:
        open(path, "rb").read(); seen["trusted_cookie"] = "read"
    except OSError as exc:
        seen["trusted_cookie"] = type(exc).__name__
print(json.dumps(seen))
"""

# An input over the whole page (a click anywhere focuses it) whose text becomes the title.
TYPED_PAGE = (
    "data:text/html,<title>empty</title><input autofocus style='position:fixed;inset:0;width:100%;height:100%'"
    " oninput='document.title=\"typed:\"+this.value'>"
)


def _exec(client: SandboxClient, argv: list[str], **more: Any) -> dict[str, Any]:
    result: dict[str, Any] = client.act({"type": "exec", "argv": argv, **more})["result"]
    return result


def _opcodes(runtime: DockerHarness, box: SandboxAddress) -> dict[str, int]:
    """The extensions' major opcodes, as a trusted client (the controller's uid and cookie) sees them."""
    code, out = runtime.exec(box.id, ["xdpyinfo", "-queryExtensions"], user="corral")
    assert code == 0, out
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("XTEST", "RECORD") and "opcode:" in line:
            found[parts[0]] = int(line.split("opcode:")[1].split(",")[0].strip(" )"))
    return found


def _title(client: SandboxClient) -> str:
    return str(client.act({"type": "page_info"})["result"]["title"])


def test_the_agents_programs_can_neither_inject_nor_record_nor_read_the_screen(
    runtime: DockerHarness, sandbox: SandboxAddress, client: SandboxClient
) -> None:
    opcodes = _opcodes(runtime, sandbox)
    assert set(opcodes) == {"XTEST", "RECORD"}, opcodes  # the server has them: the controller uses XTEST
    client.act({"type": "navigate", "url": TYPED_PAGE})
    client.act({"type": "click", "x": 640, "y": 500})  # the page's input has the focus
    run = _exec(client, [PYTHON, "-P", "-c", AGAINST_THE_X_SERVER, str(opcodes["XTEST"]), str(opcodes["RECORD"]), "5"])
    assert run["exit_code"] == 0, run["stderr"]
    seen = json.loads(run["stdout"].strip().splitlines()[-1])
    assert seen["uid"] == AGENT_UID
    time.sleep(1.0)  # what the injected keys would have typed has had its time to arrive
    assert _title(client) == "empty", seen  # no key reached the page
    assert "XTEST" not in seen["extensions"] and "RECORD" not in seen["extensions"], seen
    assert seen["xtest"] != "sent" and seen["record"] != "created", seen
    assert seen["get_image"] == "BadAccess", seen
    assert seen["xauthority"] == "/run/corral/x11/agent"  # the agent's own environment names its cookie
    # The controller's own input still types there.
    client.act({"type": "type", "text": "ok"})
    assert wait_for(lambda: _title(client) == "typed:ok", timeout_s=10), _title(client)


def test_without_the_cookie_nothing_connects_and_the_trusted_cookie_is_out_of_reach(
    sandbox: SandboxAddress, client: SandboxClient, runtime: DockerHarness
) -> None:
    run = _exec(client, ["python3", "-c", NO_COOKIE])
    assert run["exit_code"] == 0, run["stderr"]
    seen = json.loads(run["stdout"].strip().splitlines()[-1])
    assert (seen["file"], seen["abstract"]) == ("refused", "refused"), seen
    assert seen["x_tcp"] == [] and seen["trusted_cookie"] == "PermissionError", seen
    # The trusted cookie is in no environment the agent can read (only a path to it, in the controller's).
    code, cookie = runtime.exec(sandbox.id, ["xauth", "-f", "/run/corral/x11/controller", "list"], user="corral")
    assert code == 0 and "MIT-MAGIC-COOKIE-1" in cookie, cookie
    secret = cookie.split()[-1]
    dump = "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done"
    environ = _exec(client, ["sh", "-c", dump])["stdout"]
    assert "XAUTHORITY=/run/corral/x11/agent" in environ
    assert secret not in environ and secret not in environ.replace("\n", "")


def test_a_window_the_agent_opens_still_shows_and_the_controller_still_sees_and_copies(
    runtime: DockerHarness, sandbox: SandboxAddress, client: SandboxClient
) -> None:
    client.act({"type": "navigate", "url": "data:text/html,<body style='background:rgb(200,30,30)'>"})
    started = _exec(
        client, ["xmessage", "-title", "agent-probe-window", "-geometry", "+40+300", "hello"], background=True
    )
    try:

        def mapped() -> str:
            code, out = runtime.exec(sandbox.id, ["xwininfo", "-name", "agent-probe-window"], user="corral")
            return out if code == 0 and "IsViewable" in out else ""

        assert wait_for(mapped, timeout_s=15), "the agent's window never mapped"
        # The controller's capture (MIT-SHM) sees Chromium's page and the agent's window over it.
        image = screenshot_image(client)
        r, g, b = image.getpixel((900, 600))
        assert r > 150 and g < 80 and b < 80, (r, g, b)
        assert image.getpixel((45, 305)) != (r, g, b)
    finally:
        client.act({"type": "process_kill", "pid": started["pid"]})
    client.act({"type": "clipboard_set", "text": "the controller's own"})
    assert client.act({"type": "clipboard_get"})["result"]["text"] == "the controller's own"
