"""Issue 26, item 1: while a human holds the control lease, nothing of the agent's runs or observes.

Played for real: a real gateway, sandbox and proxy; the agent's own processes (started with its session
token before the take: a ``setsid`` one, a double-forked one, one that ignores SIGTSTP, one that types with
xdotool and reads the screen through X, one that makes requests without proxy credentials), the agent's own
token for commands, file actions and HTTP transfers, and a person's input through a control link's live
stream (corral.sandbox.agent.freezer, corral.sandbox.agent.launcher.sweep, corral.proxy.attribution.unvouched).
"""

from __future__ import annotations

import os
import time

import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, session_fixtures
from .gateway_fixtures import RunningGateway, traffic
from .test_takeover import Live, http_action, in_thread, make_link, open_takeover_page, secret_of, upstream_saw

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

# Counts into a file every 50 ms; SIGTSTP ignored (a polite stop would not hold it).
COUNTER = """
import os, signal, sys, time
signal.signal(signal.SIGTSTP, signal.SIG_IGN)
path, n = sys.argv[1], 0
while True:
    n += 1
    with open(path + ".new", "w") as out:
        out.write(str(n))
    os.replace(path + ".new", path)
    time.sleep(0.05)
"""
# The same, from a grandchild in a session of its own whose parents are gone (a daemon's double fork).
DOUBLE_FORK = f"""
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.execv(sys.executable, [sys.executable, "-c", {COUNTER!r}, sys.argv[1]])
"""
IMAGE_PYTHON = "/opt/corral/bin/python3"
# Types a Z with xdotool (XTEST) and reads a corner of the screen (GetImage) every 100 ms, logging each round.
X_SPY = """
import subprocess, sys, time
from Xlib import X, display
log, n = sys.argv[1], 0
root = display.Display(":0").screen().root
while True:
    n += 1
    typed = subprocess.run(["xdotool", "type", "--delay", "0", "Z"], capture_output=True).returncode
    try:
        seen = len(root.get_image(0, 0, 32, 32, X.ZPixmap, 0xFFFFFFFF).data)
    except Exception as exc:
        seen = type(exc).__name__
    with open(log, "a") as out:
        out.write(f"{n} typed={typed} seen={seen}\\n")
    time.sleep(0.1)
"""
# A request every 100 ms through the session's proxy without the proxy credentials each exec is given.
NO_CREDENTIALS = """
import os, sys, time, urllib.request
proxy = os.environ["HTTPS_PROXY"].split("@", 1)[1]  # the proxy's host:port, credentials left out
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": "http://" + proxy}))
n = 0
while True:
    n += 1
    try:
        opener.open(f"https://allowed.test/nocreds?n={n}", timeout=5).read()
    except Exception:
        pass
    time.sleep(0.1)
"""


upstream, gw, sb = session_fixtures("freeze")


def read_as_root(runtime: DockerHarness, sb: Sandbox, path: str) -> str:
    """A file of the agent's, read past the agent (docker exec as root): reading it must not need the agent."""
    code, out = runtime.exec(sb.container, ["cat", path], user="root")
    return out if code == 0 else ""


def count(runtime: DockerHarness, sb: Sandbox, path: str) -> int:
    text = read_as_root(runtime, sb, path).strip()
    return int(text) if text.isdigit() else 0


def moving(runtime: DockerHarness, sb: Sandbox, paths: list[str], within_s: float = 10) -> bool:
    """Whether every counter moves within ``within_s``."""
    start = {path: count(runtime, sb, path) for path in paths}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(count(runtime, sb, path) > start[path] for path in paths):
            return True
        time.sleep(0.1)
    return False


def take(live: Live) -> float:
    """The lease taken; how long the take's answer took (ms), which comes once the agent is frozen."""
    started = time.perf_counter()
    answer = live.ask({"type": "take"})
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert answer["type"] == "ack", answer
    return elapsed_ms


def start_counters(sb: Sandbox) -> list[str]:
    paths = ["/tmp/freeze-setsid.count", "/tmp/freeze-double.count"]
    sb.exec(argv=["setsid", "-f", "python3", "-c", COUNTER, paths[0]])
    sb.exec(argv=["python3", "-c", DOUBLE_FORK, paths[1]])
    return paths


def test_agent_processes_started_before_the_take_stand_still_for_the_human_and_run_again_after(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    paths = start_counters(sb)
    assert moving(runtime, sb, paths), [read_as_root(runtime, sb, p) for p in paths]
    # The persistent shell, an agent process too, with state of its own to keep across the turn.
    shell = sb.act({"type": "shell", "command": "export KEPT=across; cd /tmp; echo $$"})
    bash_pid = shell["result"]["output"].strip()
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    try:
        took_ms = take(live)
        frozen = [count(runtime, sb, path) for path in paths]
        time.sleep(1.5)  # 30 rounds of a counter, had it run
        assert [count(runtime, sb, path) for path in paths] == frozen, "an agent process ran during the human's turn"
        assert live.ask({"type": "release", "note": "done"})["type"] == "ack"
    finally:
        live.close()
    assert moving(runtime, sb, paths), "the agent's processes did not run again after the hand-back"
    # The same bash, thawed, its state intact.
    after = sb.act({"type": "shell", "command": "echo $$ $KEPT $PWD"})["result"]["output"].split()
    assert after == [bash_pid, "across", "/tmp"], after
    print(f"take answered in {took_ms:.0f} ms")


def test_an_agent_process_cannot_type_or_read_the_screen_while_the_human_holds_the_lease(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness, upstream: Upstream
) -> None:
    targets = open_takeover_page(sb)
    log = "/tmp/freeze-xspy.log"
    # The image's Python (python-xlib's home); the agent may run it like any program.
    probe = sb.exec(argv=[IMAGE_PYTHON, "-c", "from Xlib import display; display.Display(':0')"])
    assert probe.exit_code == 0, probe.stderr
    sb.exec(argv=["setsid", "-f", IMAGE_PYTHON, "-c", X_SPY, log])
    rounds = lambda: len(read_as_root(runtime, sb, log).splitlines())  # noqa: E731
    deadline = time.monotonic() + 15
    while rounds() < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rounds() >= 3, read_as_root(runtime, sb, log)
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    try:
        take(live)
        before = rounds()
        x, y = targets["field"]
        assert live.ask({"type": "input", "action": {"type": "click", "x": x, "y": y}})["type"] == "ack"
        time.sleep(1.0)  # the focused field, a second long: a running spy types Z's into it
        for action in ({"type": "type", "text": "secret"}, {"type": "key", "keys": "Return"}):
            assert live.ask({"type": "input", "action": action})["type"] == "ack", action
        assert upstream_saw(upstream, runtime, "/json?typed=secret"), upstream.hits(runtime)[-5:]
        assert rounds() == before, read_as_root(runtime, sb, log).splitlines()[-3:]
        assert live.ask({"type": "release"})["type"] == "ack"
    finally:
        live.close()
    deadline = time.monotonic() + 10
    while rounds() <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rounds() > before, "the spy did not run again after the hand-back"


def test_the_agents_commands_file_actions_and_transfers_wait_or_are_refused_the_humans_input_is_not(
    gw: RunningGateway, sb: Sandbox
) -> None:
    targets = open_takeover_page(sb)
    sb.files.write("/tmp/freeze-file.txt", "before")
    link = make_link(gw, sb.id, "control")
    human = f"human:{link['id']}"
    live = Live(gw, sb.id, secret_of(link))
    token = sb.info.token
    try:
        take(live)
        refused = http_action(gw, sb, {"type": "exec", "argv": ["true"]})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "control_taken", refused.text
        written = http_action(gw, sb, {"type": "file_write", "path": "/tmp/freeze-file.txt", "content": "during"})
        assert written.status_code == 409 and written.json()["error"]["holder"] == human, written.text
        files = f"/v1/sessions/{sb.id}/files"
        with gw.client(token) as c:
            down = c.get(files, params={"path": "/tmp/freeze-file.txt"})
            up = c.put(files, params={"path": "/tmp/freeze-up.txt"}, content=b"during")
        for answer in (down, up):
            assert answer.status_code == 409, (answer.status_code, answer.text)
            error = answer.json()["error"]
            assert answer.status_code == 409 and error["code"] == "control_taken", answer.text
            assert error["holder"] == human and isinstance(error["since"], float), error
        # The person's own input is not held up by any of it.
        x, y = targets["field"]
        assert live.ask({"type": "input", "action": {"type": "click", "x": x, "y": y}})["type"] == "ack"
        # A transfer that waits for the lease gets it when the person hands back.
        with gw.client(token) as c:
            started = time.monotonic()
            thread, out = in_thread(
                lambda: c.get(files, params={"path": "/tmp/freeze-file.txt", "wait_for_control_ms": "20000"})
            )
            time.sleep(1.0)
            assert not out, out  # still waiting for the lease
            assert live.ask({"type": "release"})["type"] == "ack"
            thread.join(30)
        got = out[0]
        assert got.status_code == 200 and got.content == b"before", got
        assert 1.0 <= time.monotonic() - started < 15
    finally:
        live.close()
    assert sb.files.read("/tmp/freeze-file.txt") == b"before"
    assert sb.exec(argv=["cat", "/tmp/freeze-up.txt"]).exit_code != 0  # the refused upload left nothing


def test_requests_without_credentials_are_never_charged_to_the_human(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness, upstream: Upstream
) -> None:
    targets = open_takeover_page(sb)
    sb.exec(argv=["setsid", "-f", "python3", "-c", NO_CREDENTIALS])
    assert wait_for_hit(upstream, runtime, "/nocreds?n=")
    link = make_link(gw, sb.id, "control")
    human = f"human:{link['id']}"
    live = Live(gw, sb.id, secret_of(link))
    try:
        take(live)
        x, y = targets["field"]
        for action in (
            {"type": "click", "x": x, "y": y},
            {"type": "type", "text": "abc"},
            {"type": "key", "keys": "Return"},
        ):
            assert live.ask({"type": "input", "action": action})["type"] == "ack", action
            time.sleep(0.3)
        # Handed back at once: the agent's processes run again while the person's last input is still
        # in flight for the proxy (its tail).
        assert live.ask({"type": "release"})["type"] == "ack"
    finally:
        live.close()
    time.sleep(2.0)
    records = traffic(gw, sb.id)
    agents = [r for r in records if "/nocreds" in str(r.get("url", ""))]
    assert agents, records[-5:]
    charged = [r for r in agents if str(r.get("actor", "")).startswith("human:")]
    print(
        "\nno-credentials records (action, actor):",
        sorted({(r.get("action"), r.get("actor")) for r in agents}, key=str),
    )
    assert not charged, charged[:3]
    # The person's own typing reached the page (their turn happened).
    assert upstream_saw(upstream, runtime, "/json?typed=abc")
    assert human


def test_a_restarted_controller_finds_the_agent_frozen_and_no_human_and_thaws_it(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    paths = start_counters(sb)
    assert moving(runtime, sb, paths)
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    try:
        take(live)
        frozen = [count(runtime, sb, path) for path in paths]
        time.sleep(0.5)
        assert [count(runtime, sb, path) for path in paths] == frozen
        # The controller dies with the human's lease in its memory; init starts another.
        code, out = runtime.exec(sb.container, ["pgrep", "-f", "corral.sandbox.controller"], user="root")
        assert code == 0, out
        for pid in out.split():
            runtime.exec(sb.container, ["kill", "-9", pid], user="root")
    finally:
        live.close()
    assert moving(runtime, sb, paths, within_s=30), "a restarted controller left the agent frozen"


def wait_for_hit(upstream: Upstream, runtime: DockerHarness, needle: str, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(needle in str(hit) for hit in upstream.hits(runtime)):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("processes", [10, 200])
def test_the_take_answers_once_frozen_and_how_long_that_takes(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness, processes: int
) -> None:
    sb.exec(command=f"for i in $(seq {processes}); do setsid -f sleep 600; done")
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    try:
        took_ms = take(live)
        print(f"\ntake with {processes} agent processes answered in {took_ms:.0f} ms")
        # Every process of the agent's uid is stopped by the time the take is answered.
        code, out = runtime.exec(sb.container, ["ps", "-u", "agent", "-o", "stat=,comm="], user="root")
        states = [line.split()[0] for line in out.splitlines() if line.strip()]
        assert code == 0 and len(states) >= processes, out
        assert all(state.startswith("T") for state in states), out
        assert live.ask({"type": "release"})["type"] == "ack"
    finally:
        live.close()
    assert took_ms < 5000


def test_what_the_person_copied_in_their_turn_is_not_the_agents_to_paste(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    # The person copies a password in the page (ctrl+c: Chromium owns the CLIPBOARD selection, and the
    # selected text is PRIMARY); after the hand-back neither the agent's clipboard action nor a process
    # of the agent's (an untrusted X client may still read selections) gets it.
    targets = open_takeover_page(sb)
    sb.act({"type": "clipboard_set", "text": "the agent's own"})
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    secret = "copied-" + os.urandom(6).hex()
    try:
        take(live)
        x, y = targets["field"]
        for action in (
            {"type": "click", "x": x, "y": y},
            {"type": "type", "text": secret},
            {"type": "key", "keys": "ctrl+a"},
            {"type": "key", "keys": "ctrl+c"},
        ):
            assert live.ask({"type": "input", "action": action})["type"] == "ack", action
        # Chromium takes the selection once the page answered its copy: the person hands back after that,
        # as a person does (the controller also empties what lands within a settle time after the thaw).
        deadline = time.monotonic() + 10
        while runtime.exec(sb.container, ["xclip", "-o", "-selection", "clipboard"])[1] != secret:
            assert time.monotonic() < deadline, "the person's copy never reached the clipboard"
            time.sleep(0.1)
        assert live.ask({"type": "release"})["type"] == "ack"
    finally:
        live.close()
    # A command of the agent's runs only once its processes are thawed, which is after the selections
    # were emptied; the clipboard action (the controller's own xclip) is asked after it, for the same reason.
    for selection in ("clipboard", "primary"):
        read = sb.exec(argv=["xclip", "-o", "-selection", selection], timeout_ms=5000)
        assert secret not in read.stdout, (selection, read)
    assert secret not in sb.act({"type": "clipboard_get"})["result"]["text"]


def test_a_cells_timeout_in_the_persons_turn_waits_for_it_and_keeps_the_kernel(gw: RunningGateway, sb: Sandbox) -> None:
    # The kernel is frozen with the rest: interrupted during the turn, it could answer no SIGINT in
    # its grace (3 s) and would be killed, the agent's variables lost for the person's turn.
    assert sb.run_code("kept = 42").error is None
    thread, out = in_thread(lambda: sb.run_code("import time\nwhile True:\n    time.sleep(0.05)", timeout_ms=1000))
    time.sleep(0.5)  # the cell runs
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    try:
        take(live)
        time.sleep(5)  # past the cell's timeout and the interrupt's grace, in the person's turn
        assert thread.is_alive(), out
        assert live.ask({"type": "release", "note": "done"})["type"] == "ack"
    finally:
        live.close()
    thread.join(60)
    (execution,) = out
    assert execution.timed_out and not execution.state_lost, execution
    assert sb.run_code("kept").text == "42"
