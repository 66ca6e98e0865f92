"""Chromium and openbox apart from the agent (issue 26, item 3), attacked for real: processes run as
the agent's uid (its own ``exec`` through the gateway) against the browser's processes, and the
browser's features the agent relies on (downloads, uploads, egress through the proxy with the session
CA, DevTools kept from the agent) still working."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from corral.errors import ActionFailed
from corral.sdk import Sandbox

from .cdpwire import cdp_call, cdp_socket
from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway, traffic

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

AGENT_UID, BROWSER_UID = 1100, 1200
HOME = "/home/agent"

# Run as the agent's uid: everything a process of the agent's might try against Chromium's and
# openbox's processes to read what a person typed. Prints one JSON object, per pid.
AGAINST_THE_BROWSER = r"""
import ctypes, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
seen = {"uid": os.getuid()}
def attempt(fn):
    try:
        fn(); return "done"
    except OSError as exc:
        return type(exc).__name__
def read_mem(pid):
    with open(f"/proc/{pid}/maps") as maps:
        start = int(maps.readline().split("-")[0], 16)
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(start); mem.read(16)
for pid in map(int, sys.argv[1:]):
    with open(f"/proc/{pid}/status") as status:
        uids = [line.split()[1:] for line in status if line.startswith("Uid:")][0]
    row = {"uids": uids}
    row["mem"] = attempt(lambda: read_mem(pid))
    row["mem_open"] = attempt(lambda: open(f"/proc/{pid}/mem", "rb").close())
    row["environ"] = attempt(lambda: open(f"/proc/{pid}/environ", "rb").read())
    row["fds"] = attempt(lambda: os.listdir(f"/proc/{pid}/fd"))
    if libc.ptrace(PTRACE_ATTACH, pid, 0, 0) == 0:
        row["ptrace"] = "done"; libc.ptrace(PTRACE_DETACH, pid, 0, 0)
    else:
        row["ptrace"] = os.strerror(ctypes.get_errno())
    row["stop"] = attempt(lambda: os.kill(pid, signal.SIGSTOP))
    os.kill(pid, signal.SIGCONT) if row["stop"] == "done" else None
    seen[str(pid)] = row
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-apart-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("apart-gw"), f"apart-{os.getpid()}") as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sandbox:
        yield sandbox


# An input over the whole page (a click anywhere focuses it) whose text becomes the title.
TYPED_PAGE = (
    "data:text/html,<input autofocus style='position:fixed;inset:0;width:100%;height:100%'"
    " oninput='document.title=this.value'>"
)


def pids_of(runtime: DockerHarness, container: str, name: str) -> list[int]:
    code, out = runtime.exec(container, ["pgrep", "-x", name], user="root")
    assert code == 0, out
    return [int(pid) for pid in out.split()]


def test_the_agents_processes_can_neither_read_nor_trace_nor_stop_the_browser(
    sb: Sandbox, runtime: DockerHarness
) -> None:
    # A person's text in the page, as a takeover would leave it in Chromium's memory.
    sb.navigate(TYPED_PAGE)
    sb.act({"type": "click", "x": 640, "y": 500})
    sb.act({"type": "type", "text": "hunter2-typed-by-a-person"})
    assert wait_for(lambda: sb.page_info().title == "hunter2-typed-by-a-person", timeout_s=10)
    chromium = pids_of(runtime, sb.container, "chromium")
    openbox = pids_of(runtime, sb.container, "openbox")
    run = sb.exec(argv=["python3", "-c", AGAINST_THE_BROWSER, *map(str, chromium + openbox)])
    assert run.exit_code == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen.pop("uid") == AGENT_UID
    assert len(seen) == len(chromium) + len(openbox) >= 3  # the browser, a renderer at least, openbox
    for pid, row in seen.items():
        assert row["uids"] == [str(BROWSER_UID)] * 4, (pid, row)  # real, effective, saved, filesystem
        for attempt in ("mem", "mem_open", "environ", "fds", "stop"):
            assert row[attempt] == "PermissionError", (pid, row)
        assert row["ptrace"] == os.strerror(1), (pid, row)  # EPERM
    # Nothing was stopped or lost: the same processes, the page still answers, the text is there.
    assert pids_of(runtime, sb.container, "chromium")[0] == chromium[0]
    _, out = runtime.exec(sb.container, ["ps", "-o", "stat=", "-p", ",".join(map(str, chromium))], user="root")
    assert "T" not in out, out
    sb.act({"type": "type", "text": "!"})
    assert wait_for(lambda: sb.page_info().title == "hunter2-typed-by-a-person!", timeout_s=10)


def test_what_the_agent_sees_of_the_browser_is_true(sb: Sandbox) -> None:
    # Browser reports stay honest: process listings name the browser's uid, not the agent's.
    run = sb.exec(argv=["ps", "-o", "user=,comm=", "-C", "chromium,openbox"])
    assert run.exit_code == 0, run.stderr
    owners = {line.split()[0] for line in run.stdout.splitlines()}
    assert owners == {"browser"}, run.stdout
    # And the agent can kill none of them.
    killed = sb.exec(argv=["pkill", "-KILL", "-x", "chromium"])
    assert killed.exit_code != 0 and "not permitted" in killed.stderr.lower(), killed
    assert sb.navigate("data:text/html,<title>still-here</title>").title == "still-here"


def test_downloads_are_the_agents_to_read_and_remove_and_the_profile_is_not_its_to_write(sb: Sandbox) -> None:
    sb.navigate("https://allowed.test/page/download.html")  # through the proxy, with the session CA
    downloads = f"{HOME}/Downloads"

    def saved() -> dict[str, object] | None:
        try:
            entries = sb.act({"type": "file_list", "path": downloads})["result"]["entries"]
        except ActionFailed:
            return None
        return next((entry for entry in entries if entry["name"] == "corral-report.bin"), None)

    entry = wait_for(saved, timeout_s=20)
    assert entry, sb.act({"type": "file_list", "path": HOME})
    path = f"{downloads}/corral-report.bin"
    owner = sb.exec(argv=["stat", "-c", "%U %G %a", downloads, path])
    assert owner.stdout.split("\n")[:2] == ["agent agent 2770", "browser agent 660"], owner.stdout
    assert sb.exec(argv=["cat", path]).stdout == "corral download corral-report.bin\n" * 64
    assert sb.exec(argv=["rm", path]).exit_code == 0
    # Chromium's home and profile are the browser's alone.
    for attempt in (["ls", "/tmp/corral-browser"], ["touch", "/tmp/corral-browser/profile/planted"]):
        denied = sb.exec(argv=attempt)
        assert denied.exit_code != 0 and "Permission denied" in denied.stderr, (attempt, denied)


UPLOAD_PAGE = (
    "data:text/html,<title>waiting</title><input type=file id=f>"
    "<script>f.onchange=async()=>{document.title='read '+(await f.files[0].text())}</script>"
)


def test_a_page_uploads_a_file_from_the_agents_home(gw: RunningGateway, sb: Sandbox) -> None:
    sb.files.write(f"{HOME}/upload-me.txt", "the agent's own file")
    sb.navigate(UPLOAD_PAGE)
    with cdp_socket(gw, sb) as ws:
        targets = cdp_call(ws, 1, "Target.getTargets")["result"]["targetInfos"]
        page = next(t for t in targets if t["type"] == "page" and t["url"].startswith("data:"))
        session = cdp_call(ws, 2, "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
        sid = session["result"]["sessionId"]
        found = cdp_call(ws, 3, "Runtime.evaluate", {"expression": "document.getElementById('f')"}, sessionId=sid)
        node = found["result"]["result"]["objectId"]
        given = {"files": [f"{HOME}/upload-me.txt"], "objectId": node}
        answer = cdp_call(ws, 4, "DOM.setFileInputFiles", given, sessionId=sid)
        assert "error" not in answer, answer
    title = wait_for(lambda: (t := str(sb.page_info().title)).startswith("read ") and t, timeout_s=10)
    assert title == "read the agent's own file"


CONNECT_9222 = """
import socket
try:
    socket.create_connection(("127.0.0.1", 9222), timeout=2).close(); print("open")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_devtools_stays_closed_to_the_agent_and_the_browser_goes_out_through_the_proxy(
    gw: RunningGateway, sb: Sandbox
) -> None:
    assert sb.exec(argv=["python3", "-c", CONNECT_9222]).stdout.strip() == "ConnectionRefusedError"
    # HTTPS through the session's proxy, its CA trusted in the browser's own NSS store.
    reply = sb.act({"type": "navigate", "url": "https://allowed.test/hello"})
    assert wait_for(lambda: str(sb.page_info().title) == "upstream allowed.test", timeout_s=20)
    records = traffic(gw, sb.id, host="allowed.test", event="request")
    page = next(r for r in records if r["url"].startswith("https://allowed.test/hello"))
    assert (page["status"], page["decision"], page["action"]) == (200, "allow", reply["action_id"])
    sb.navigate("https://other.test/secret")
    assert wait_for(lambda: str(sb.page_info().title) == "Blocked by Corral: other.test", timeout_s=20)
