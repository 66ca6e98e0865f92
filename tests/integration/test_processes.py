"""Commands and processes against the real image: ``exec`` and ``process_*`` through the controller's
WebSocket, run as the agent by the launcher (issue 12). Every check of what is left running is made
with ``ps`` inside the sandbox afterwards."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time

import pytest

from corral.runtime import SandboxAddress

from .dockerutil import DockerHarness
from .procwire import wire

pytestmark = pytest.mark.usefixtures("desktop_image")


def processes(runtime: DockerHarness, box: SandboxAddress) -> list[str]:
    """Every process in the sandbox, as ``user args`` lines (ps run as root, who sees them all)."""
    code, out = runtime.exec(box.id, ["ps", "-eo", "user:12,args", "--no-headers"], user="root")
    assert code == 0, out
    return [line.strip() for line in out.splitlines() if line.strip()]


def leftovers(runtime: DockerHarness, box: SandboxAddress, marker: str) -> list[str]:
    return [line for line in processes(runtime, box) if marker in line and "ps -eo" not in line]


async def gone(runtime: DockerHarness, box: SandboxAddress, marker: str, attempts: int = 50) -> list[str]:
    """What still runs with ``marker`` in its arguments, once nothing does or after ``attempts`` looks."""
    for _ in range(attempts):
        left = leftovers(runtime, box, marker)
        if not left:
            break
        await asyncio.sleep(0.1)
    return left


async def test_exit_codes_and_separate_streams(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        done = await w.result({"type": "exec", "command": "echo out; echo err >&2; exit 3"})
        assert (done["exit_code"], done["stdout"], done["stderr"]) == (3, "out\n", "err\n")
        assert done["signal"] is None and done["timed_out"] is False and done["oom_killed"] is False
        assert done["pid"] > 1 and done["duration_ms"] >= 0 and done["encoding"] == "utf-8"
        done = await w.result({"type": "exec", "argv": ["printf", "%s|", "a b", "c"]})
        assert (done["exit_code"], done["stdout"]) == (0, "a b|c|")
        # Run as the agent, in /workspace, with the command environment.
        done = await w.result({"type": "exec", "command": 'id -u; pwd; echo "$HOME $USER $TERM $X"', "env": {"X": "y"}})
        assert done["stdout"] == "1100\n/workspace\n/home/agent agent dumb y\n"
        # The login shell keeps the PATH it was given (Debian's /etc/profile would reset it).
        path = await w.result({"type": "exec", "command": "echo $PATH"})
        assert path["stdout"].startswith("/home/agent/.local/bin:"), path
        # bash's own exit codes are results, not errors.
        missing = await w.result({"type": "exec", "command": "no-such-program-here"})
        assert missing["exit_code"] == 127 and "not found" in missing["stderr"]
        not_executable = await w.result({"type": "exec", "command": "/etc/passwd"})
        assert not_executable["exit_code"] == 126
        # stdin, as text and as bytes.
        done = await w.result({"type": "exec", "argv": ["wc", "-c"], "stdin": "hello"})
        assert done["stdout"].strip() == "5"
        raw = bytes(range(256))
        done = await w.result(
            {
                "type": "exec",
                "argv": ["cat"],
                "stdin_base64": base64.b64encode(raw).decode(),
                "output_encoding": "base64",
            }
        )
        assert base64.b64decode(done["stdout"]) == raw and done["encoding"] == "base64"
        # /workspace is the agent's, executable, and a program built there runs.
        done = await w.result(
            {"type": "exec", "command": "printf '#!/bin/sh\\necho built\\n' > run.sh && chmod +x run.sh && ./run.sh"}
        )
        assert done["stdout"] == "built\n", done


async def test_truncation_flags_per_stream(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        done = await w.result(
            {
                "type": "exec",
                "command": "head -c 300000 /dev/zero | tr '\\0' a; echo short >&2",
                "max_output_bytes": 1000,
            }
        )
        assert done["stdout"] == "a" * 1000 and done["stdout_truncated"] is True
        assert done["stderr"] == "short\n" and done["stderr_truncated"] is False
        exact = await w.result({"type": "exec", "command": "printf 12345", "max_output_bytes": 5})
        assert exact["stdout"] == "12345" and exact["stdout_truncated"] is False
        # Invalid UTF-8 is replaced in utf-8 mode, kept in base64 mode.
        done = await w.result({"type": "exec", "command": "printf 'a\\377b'"})
        assert done["stdout"] == "a\ufffdb"


async def test_timeout_kills_the_whole_tree(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    marker = "61" + str(int(time.time() * 1000) % 100000)  # unique sleep lengths, found by ps afterwards
    command = (
        f"sleep {marker}0 & setsid sleep {marker}1 & (setsid sh -c 'sleep {marker}2' &); "
        f"nohup sleep {marker}3 >/dev/null 2>&1 & echo started; sleep {marker}4"
    )
    async with wire(sandbox) as w:
        started = time.monotonic()
        done = await w.result({"type": "exec", "command": command, "timeout_ms": 1500})
        assert time.monotonic() - started < 10
    assert done["timed_out"] is True and done["signal"] == "SIGKILL" and done["exit_code"] is None
    assert done["stdout"] == "started\n"
    assert await gone(runtime, sandbox, f"sleep {marker}") == []


async def test_foreground_exec_returns_when_its_process_exits(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    marker = "62" + str(int(time.time() * 1000) % 100000)
    async with wire(sandbox) as w:
        started = time.monotonic()
        done = await w.result({"type": "exec", "command": f"sleep {marker} & echo left"})
        assert time.monotonic() - started < 5 and done["stdout"] == "left\n" and done["exit_code"] == 0
        listed = {p["pid"]: p for p in (await w.result({"type": "process_list"}))["processes"]}
        assert listed[done["pid"]]["running"] is True  # its child still runs
        assert leftovers(runtime, sandbox, f"sleep {marker}")
        killed = await w.result({"type": "process_kill", "pid": done["pid"]})
        assert killed == {"pid": done["pid"], "signal": "SIGKILL"}
        assert await gone(runtime, sandbox, f"sleep {marker}") == []
        waited = await w.result({"type": "process_wait", "pid": done["pid"], "timeout_ms": 5000})
        assert waited["exit_code"] == 0 and waited["timed_out"] is False
        for _ in range(50):
            listed = {p["pid"]: p for p in (await w.result({"type": "process_list"}))["processes"]}
            if not listed[done["pid"]]["running"]:
                break
            await asyncio.sleep(0.05)
        assert listed[done["pid"]]["running"] is False


async def test_background_process_with_stdin_and_wait(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        started = await w.result({"type": "exec", "argv": ["tr", "a-z", "A-Z"], "background": True})
        assert started["background"] is True
        pid = started["pid"]
        waited = await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 200})
        assert waited["timed_out"] is True and waited["running"] is True and waited["exit_code"] is None
        assert (await w.result({"type": "process_write", "pid": pid, "data": "hello "})) == {"pid": pid, "written": 6}
        data = base64.b64encode(b"world\n").decode()
        await w.result({"type": "process_write", "pid": pid, "data_base64": data, "eof": True})
        waited = await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 5000})
        assert waited["exit_code"] == 0 and waited["timed_out"] is False and waited["signal"] is None
        out = await w.result({"type": "process_output", "pid": pid})
        assert out["data"] == "HELLO WORLD\n" and out["offset"] == 0 and out["next_offset"] == 12
        assert out["exit_code"] == 0 and out["dropped"] == 0
        after_eof = await w.call({"type": "process_write", "pid": pid, "data": "more"})
        assert after_eof["ok"] is False and after_eof["error"]["field"] == "action.pid"
        listed = [p for p in (await w.result({"type": "process_list"}))["processes"] if p["pid"] == pid]
        assert listed and listed[0]["argv"] == ["tr", "a-z", "A-Z"] and listed[0]["background"] is True
        assert listed[0]["cwd"] == "/workspace" and listed[0]["action_id"].startswith("a")


async def test_process_output_offsets(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        pid = (await w.result({"type": "exec", "argv": ["seq", "1", "1000"], "background": True}))["pid"]
        await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 5000})
        first = await w.result({"type": "process_output", "pid": pid, "max_bytes": 10})
        assert first["data"] == "1\n2\n3\n4\n5\n" and first["next_offset"] == 10
        second = await w.result({"type": "process_output", "pid": pid, "offset": 10, "max_bytes": 4})
        assert second["data"] == "6\n7\n" and second["offset"] == 10 and second["next_offset"] == 14
        whole = await w.result({"type": "process_output", "pid": pid})
        assert whole["data"] == "".join(f"{n}\n" for n in range(1, 1001))
        end = await w.result({"type": "process_output", "pid": pid, "offset": 10**9})
        assert end["data"] == "" and end["offset"] == whole["next_offset"]
        err = await w.result({"type": "process_output", "pid": pid, "stream": "stderr"})
        assert err["data"] == "" and err["running"] is False


async def test_streamed_output_comes_before_the_reply(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        request_id = await w.send(
            {"type": "exec", "command": "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three", "stream": True}
        )
        reply = await w.reply(request_id)
        assert reply["ok"] and reply["result"]["stdout"] == "one\nthree\n"
        events = w.events[request_id]
        assert all(set(e) == {"id", "event", "stream", "data", "encoding"} for e in events)
        assert [(e["stream"], e["data"]) for e in events] == [
            ("stdout", "one\n"),
            ("stderr", "two\n"),
            ("stdout", "three\n"),
        ]
        # Every event of the request came before its reply.
        order = [i for i, f in enumerate(w.frames) if f.get("id") == request_id]
        assert "ok" in w.frames[order[-1]] and all("ok" not in w.frames[i] for i in order[:-1])


async def test_an_exec_on_a_connection_can_be_killed_from_it(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    marker = "63" + str(int(time.time() * 1000) % 100000)
    async with wire(sandbox) as w:
        running = await w.send({"type": "exec", "command": f"sleep {marker}; echo never"})
        # The connection still answers while the exec runs: a screenshot, then the kill.
        shot = await w.call({"type": "screenshot"}, timeout_s=10)
        assert shot["ok"]
        for _ in range(50):
            listed = (await w.result({"type": "process_list"}))["processes"]
            mine = [p for p in listed if p["command"] and marker in p["command"] and p["running"]]
            if mine:
                break
            await asyncio.sleep(0.05)
        killed = await w.result({"type": "process_kill", "pid": mine[0]["pid"], "signal": "KILL"})
        assert killed["signal"] == "SIGKILL"
        reply = await w.reply(running, timeout_s=10)
        assert reply["ok"] and reply["id"] == running
        assert reply["result"]["signal"] == "SIGKILL" and reply["result"]["timed_out"] is False
        assert reply["result"]["stdout"] == ""
    assert await gone(runtime, sandbox, f"sleep {marker}") == []


async def test_process_kill_sends_other_signals_to_the_group(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
        pid = (await w.result({"type": "exec", "command": script, "background": True}))["pid"]
        for _ in range(100):
            if "ready" in (await w.result({"type": "process_output", "pid": pid}))["data"]:
                break
            await asyncio.sleep(0.05)
        assert (await w.result({"type": "process_kill", "pid": pid, "signal": "SIGTERM"}))["signal"] == "SIGTERM"
        waited = await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 5000})
        assert waited["exit_code"] == 7
        assert "got-term" in (await w.result({"type": "process_output", "pid": pid}))["data"]


async def test_pty_echo_and_resize(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        pty = {"rows": 30, "cols": 100}
        done = await w.result({"type": "exec", "command": "stty size; tty; echo $TERM", "pty": pty})
        lines = done["stdout"].replace("\r\n", "\n").splitlines()
        assert lines[0] == "30 100" and lines[1].startswith("/dev/pts/") and lines[2] == "xterm-256color"
        assert done["stderr"] == ""
        pid = (await w.result({"type": "exec", "argv": ["cat"], "pty": pty, "background": True}))["pid"]
        await w.result({"type": "process_write", "pid": pid, "data": "hello\n"})
        for _ in range(100):
            out = (await w.result({"type": "process_output", "pid": pid}))["data"]
            if out.count("hello") >= 2:
                break
            await asyncio.sleep(0.05)
        assert out.count("hello") == 2, out  # the terminal's echo, then cat's copy
        resized = await w.result({"type": "process_resize", "pid": pid, "rows": 40, "cols": 120})
        assert resized == {"pid": pid, "rows": 40, "cols": 120}
        only_stdout = await w.call({"type": "process_output", "pid": pid, "stream": "stderr"})
        assert only_stdout["error"]["field"] == "action.stream"
        await w.result({"type": "process_write", "pid": pid, "data": "", "eof": True})
        assert (await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 5000}))["exit_code"] == 0
        shell = await w.result({"type": "exec", "command": "stty size", "pty": {"rows": 40, "cols": 120}})
        assert shell["stdout"].strip() == "40 120"


async def test_a_program_that_closes_its_terminal_before_it_exits_is_not_hung_up(sandbox: SandboxAddress) -> None:
    # cat closes stdin, stdout and stderr itself after end of file, then exits: the master reads EIO
    # while it still runs. Closing the master then would hang the terminal up (SIGHUP; seen in about
    # one run in three before the master waited for the exit).
    async with wire(sandbox) as w:
        for _ in range(10):
            pid = (
                await w.result({"type": "exec", "argv": ["cat"], "pty": {"rows": 5, "cols": 20}, "background": True})
            )["pid"]
            await w.result({"type": "process_write", "pid": pid, "data": "x\n", "eof": True})
            done = await w.result({"type": "process_wait", "pid": pid, "timeout_ms": 5000})
            assert (done["exit_code"], done["signal"]) == (0, None), done


BAD = [
    ({"type": "exec", "argv": ["true"], "cwd": "/no/such/dir"}, "no_such_file", "action.cwd"),
    ({"type": "exec", "argv": ["true"], "cwd": "/etc/passwd"}, "not_a_directory", "action.cwd"),
    ({"type": "exec", "argv": ["true"], "cwd": "/run/corral/controller"}, "permission_denied", "action.cwd"),
    ({"type": "exec", "argv": ["no-such-program-here"]}, "program_not_found", "action.argv"),
    ({"type": "exec", "argv": ["/etc/passwd"]}, "permission_denied", "action.argv"),
    ({"type": "exec", "argv": ["echo", "a\u0000b"]}, "invalid_field", "action.argv[1]"),
    ({"type": "exec", "command": "echo a\u0000b"}, "invalid_field", "action.command"),
    ({"type": "exec", "argv": ["true"], "env": {"A": "x\u0000"}}, "invalid_field", "action.env"),
    ({"type": "exec", "argv": ["true"], "env": {"1A": "x"}}, "invalid_field", "action.env"),
    ({"type": "exec", "argv": ["true"], "cwd": "/tmp\u0000x"}, "invalid_field", "action.cwd"),
    ({"type": "exec"}, "invalid_field", "action"),
    ({"type": "exec", "command": "true", "argv": ["true"]}, "invalid_field", "action"),
    ({"type": "exec", "argv": []}, "invalid_field", "action.argv"),
    ({"type": "exec", "argv": ["true"], "timeout_ms": 700_000}, "invalid_field", "action.timeout_ms"),
    ({"type": "exec", "argv": ["true"], "max_output_bytes": 1 << 30}, "invalid_field", "action.max_output_bytes"),
    ({"type": "exec", "argv": ["true"], "stdin_base64": "not base64!"}, "invalid_field", "action.stdin_base64"),
    ({"type": "process_wait", "pid": 999_999}, "no_such_process", "action.pid"),
    ({"type": "process_kill", "pid": 999_999}, "no_such_process", "action.pid"),
    ({"type": "process_write", "pid": 999_999, "data": "x"}, "no_such_process", "action.pid"),
    ({"type": "process_output", "pid": 999_999}, "no_such_process", "action.pid"),
    ({"type": "process_resize", "pid": 999_999, "rows": 5, "cols": 5}, "no_such_process", "action.pid"),
    ({"type": "process_kill", "pid": 1, "signal": "SIGNOPE"}, "invalid_field", "action.signal"),
]


async def test_bad_input_is_a_structured_error_and_the_session_goes_on(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        for action, code, field in BAD:
            reply = await w.call(action)
            assert reply["ok"] is False, action
            assert (reply["error"]["code"], reply["error"].get("field")) == (code, field), (action, reply)
        # Text that is not UTF-8 (a lone surrogate, which JSON can carry) never reaches a program.
        raw = '{"id": "s", "action": {"type": "exec", "argv": ["echo", "\\udcff"]}}'
        await w._ws.send(raw)
        for _ in range(100):
            surrogate = [f for f in w.frames if f.get("id") == "s"]
            if surrogate:
                break
            await asyncio.sleep(0.05)
        assert surrogate[0]["error"] == {
            "code": "invalid_field",
            "message": surrogate[0]["error"]["message"],
            "field": "action.argv[1]",
        }
        # A process without a terminal cannot be resized; a kill signal to a name that is none is refused.
        pid = (await w.result({"type": "exec", "argv": ["sleep", "30"], "background": True}))["pid"]
        not_pty = await w.call({"type": "process_resize", "pid": pid, "rows": 5, "cols": 5})
        assert not_pty["error"]["code"] == "invalid_request" and not_pty["error"]["field"] == "action.pid"
        await w.result({"type": "process_kill", "pid": pid})
        # Still working: a command and a screenshot.
        assert (await w.result({"type": "exec", "argv": ["true"]}))["exit_code"] == 0
        assert (await w.call({"type": "screenshot"}))["ok"]


# Run as the agent through exec: what a hostile command might try against the launcher, its shepherd,
# the controller and their secrets. Prints one JSON object.
ATTACK = r"""
import ctypes, json, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
def pid_of(module):
    # The oldest process running the module (the launcher's shepherds are forks of it, younger).
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if open(f"/proc/{name}/cmdline", "rb").read() == b"/opt/corral/bin/python\0-P\0-m\0" + module + b"\0":
                    found.append(int(name))
            except OSError:
                pass
    return min(found, default=None)
seen = {}
def attempt(name, fn):
    try:
        fn(); seen[name] = "done"
    except OSError as exc:
        seen[name] = type(exc).__name__
targets = {
    "launcher": pid_of(b"corral.sandbox.agent.launcher"),
    "controller": pid_of(b"corral.sandbox.controller"),
    "shepherd": os.getppid(),
}
seen["pids"] = targets
for who, pid in targets.items():
    attempt(f"signal {who}", lambda pid=pid: os.kill(pid, signal.SIGSTOP))
    attempt(f"kill {who}", lambda pid=pid: os.kill(pid, signal.SIGKILL))
    seen[f"ptrace {who}"] = "done" if libc.ptrace(16, pid, 0, 0) == 0 else os.strerror(ctypes.get_errno())
    attempt(f"mem {who}", lambda pid=pid: open(f"/proc/{pid}/mem", "rb").read(1))
    attempt(f"oom {who}", lambda pid=pid: open(f"/proc/{pid}/oom_score_adj", "w").write("-1000"))
def connect_launcher():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("/run/corral/launcher/sock")
attempt("connect launcher", connect_launcher)
attempt("list launcher dir", lambda: os.listdir("/run/corral/launcher"))
attempt("read secret", lambda: open("/run/corral/controller/secret").read())
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
for key in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapAmb", "NoNewPrivs"):
    seen[key] = status[key].split()
seen["nice"] = os.nice(0)
seen["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()
seen["sid_is_pid"] = os.getsid(0) == os.getpid()
seen["policy"] = os.sched_getscheduler(0)
seen["shepherd policy"] = os.sched_getscheduler(os.getppid())
print(json.dumps(seen))
"""


LAUNCHER_STATUS = (
    ATTACK.split("seen = {}")[0]
    + """
print(open(f"/proc/{pid_of(b'corral.sandbox.agent.launcher')}/status").read())
"""
)


async def test_the_agent_cannot_reach_the_launcher_or_the_processes_that_hold_privilege(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    async with wire(sandbox) as w:
        done = await w.result({"type": "exec", "argv": ["python3", "-c", ATTACK]})
        assert done["exit_code"] == 0, done
        seen = json.loads(done["stdout"])
        assert all(seen["pids"].values()), seen
        for who in ("launcher", "controller", "shepherd"):
            assert seen[f"signal {who}"] == seen[f"kill {who}"] == "PermissionError", seen
            assert seen[f"ptrace {who}"] == "Operation not permitted", seen
            assert seen[f"mem {who}"] == "PermissionError" and seen[f"oom {who}"] == "PermissionError", seen
        assert seen["connect launcher"] == seen["list launcher dir"] == seen["read secret"] == "PermissionError"
        assert seen["Uid"] == ["1100"] * 4 and seen["Gid"] == ["1100"] * 4 and seen["Groups"] == []
        assert {seen[k][0] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {"0000000000000000"}
        assert seen["NoNewPrivs"] == ["1"]
        assert seen["nice"] == 10 and seen["oom_score_adj"] == "1000" and seen["sid_is_pid"] is True
        # The agent's program runs SCHED_OTHER as ever; its shepherd SCHED_BATCH (no wake-up of its
        # preempts the controller: docs/design/0450).
        assert (seen["policy"], seen["shepherd policy"]) == (os.SCHED_OTHER, os.SCHED_BATCH), seen
        # The launcher and the shepherd hold only SETUID/SETGID; every process the agent runs shows uid 1100.
        shown = await w.result({"type": "exec", "command": "sleep 5 & ps -o user=,pid= --ppid $$; kill %1"})
        assert shown["exit_code"] == 0 and all(line.split()[0] == "agent" for line in shown["stdout"].splitlines())
    code, status = runtime.exec(sandbox.id, ["python3", "-c", LAUNCHER_STATUS], "root")
    assert code == 0, status
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["Uid"].split() == ["1000"] * 4
    assert int(fields["CapEff"], 16) == int(fields["CapBnd"], 16) == int(fields["CapAmb"], 16) == (1 << 6) | (1 << 7)


async def test_trees_die_with_the_controllers_end(runtime: DockerHarness, spare_sandbox: SandboxAddress) -> None:
    marker = "64" + str(int(time.time() * 1000) % 100000)
    async with wire(spare_sandbox) as w:
        await w.result({"type": "exec", "command": f"setsid sleep {marker} & sleep {marker}", "background": True})
        assert leftovers(runtime, spare_sandbox, f"sleep {marker}")
    # The controller dies (init restarts it): its control channels close, each shepherd kills its tree.
    code, _ = runtime.exec(spare_sandbox.id, ["pkill", "-KILL", "-f", "corral.sandbox.controller"], user="corral")
    assert code == 0
    assert await gone(runtime, spare_sandbox, f"sleep {marker}") == []


# Run as the agent: kill Chromium and take its DevTools port, to answer the controller in its place.
TAKE_DEVTOOLS = r"""
import errno, json, socket, subprocess
seen = {"pkill": subprocess.run(["pkill", "-KILL", "-x", "chromium"], capture_output=True, text=True).stderr}
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", 9222)); seen["bind"] = "done"
except OSError as exc:
    seen["bind"] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""


async def test_the_agent_can_neither_kill_chromium_nor_take_its_devtools_port(
    spare_sandbox: SandboxAddress, runtime: DockerHarness
) -> None:
    # Chromium runs as the browser's uid: what it reports is its own word (docs/egress.md).
    code, before = runtime.exec(spare_sandbox.id, ["pgrep", "-o", "-x", "chromium"], user="root")
    assert code == 0, before
    async with wire(spare_sandbox) as w:
        run = await w.result({"type": "exec", "argv": ["python3", "-c", TAKE_DEVTOOLS]})
        seen = json.loads(run["stdout"].strip().splitlines()[-1])
        assert "Operation not permitted" in seen["pkill"], seen
        assert seen["bind"] == "EADDRINUSE", seen
        back = await w.call({"type": "navigate", "url": "data:text/html,<title>still</title>"})
        assert back["ok"] and back["result"]["title"] == "still", back
    code, after = runtime.exec(spare_sandbox.id, ["pgrep", "-o", "-x", "chromium"], user="root")
    assert after == before


# Run as the controller's uid (corral) inside the sandbox: the AgentFs primitives through the real
# launcher. Prints one JSON object.
AGENT_FS = r"""
import asyncio, json, os
from corral.sandbox.agent.launcher import LauncherClient

async def main():
    fs, seen = LauncherClient(), {}
    async def attempt(name, call):
        try:
            seen[name] = await call
        except OSError as exc:
            seen[name] = [exc.errno, exc.filename]
    await fs.mkdir("/workspace/fs/a/b", parents=True)
    fd, temp = await fs.mkstemp("/workspace/fs", ".tmp-")
    os.write(fd, b"hello")
    os.close(fd)
    seen["temp_mode"] = oct((await fs.stat(temp)).mode)
    await fs.chmod(temp, 0o640)
    await fs.rename(temp, "/workspace/fs/file")
    fd, _ = await fs.mkstemp("/workspace/fs", ".tmp-")
    os.close(fd)
    await attempt("noreplace", fs.rename(_, "/workspace/fs/file", replace=False))
    await fs.unlink(_)
    stat = await fs.stat("/workspace/fs/file")
    seen["file"] = [stat.name, stat.type, stat.size, oct(stat.mode)]
    fd = await fs.open("/workspace/fs/file", os.O_RDONLY)
    seen["read"] = os.read(fd, 100).decode()
    seen["owner"] = os.fstat(fd).st_uid
    os.close(fd)
    fd = await fs.open("/workspace/fs/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    seen["new_owner"] = os.fstat(fd).st_uid
    os.close(fd)
    await fs.mkdir(os.fsdecode(b"/workspace/fs/\xff"))
    entries, truncated = await fs.scandir("/workspace/fs", 10)
    seen["names"] = sorted(os.fsencode(e.name).hex() for e in entries)
    seen["truncated"] = truncated
    seen["limited"] = (await fs.scandir("/workspace/fs", 1))[1]
    await attempt("secret", fs.open("/run/corral/controller/secret", os.O_RDONLY))
    await attempt("launcher_dir", fs.scandir("/run/corral/launcher", 10))
    await attempt("missing", fs.stat("/workspace/none"))
    await attempt("rmdir_full", fs.rmdir("/workspace/fs/a"))
    await fs.rmtree("/workspace/fs/a")
    await attempt("gone", fs.stat("/workspace/fs/a"))
    await fs.rmtree("/workspace/fs")
    seen["left"] = os.path.exists("/workspace/fs")
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_file_operations_run_as_the_agent_through_the_launcher(runtime: DockerHarness, sandbox: SandboxAddress) -> None:
    code, out = runtime.exec(sandbox.id, ["python", "-c", AGENT_FS], user="corral")
    assert code == 0, out
    seen = json.loads(out.splitlines()[-1])
    assert seen["temp_mode"] == "0o600" and seen["noreplace"][0] == 17  # EEXIST: nothing replaced
    assert seen["file"] == ["file", "file", 5, "0o640"]
    assert seen["read"] == "hello" and seen["owner"] == seen["new_owner"] == 1100
    assert seen["names"] == sorted(["61", "66696c65", "6e6577", "ff"])  # a, file, new, and b"\xff"
    assert seen["truncated"] is False and seen["limited"] is True
    assert seen["secret"] == [13, "/run/corral/controller/secret"]
    assert seen["launcher_dir"][0] == 13 and seen["missing"] == [2, "/workspace/none"]
    assert seen["rmdir_full"][0] == 39 and seen["gone"][0] == 2 and seen["left"] is False


# Run as the controller's uid inside the sandbox: a reserved shepherd through the real launcher. One
# is dropped unused (its shepherd and child must end); another starts a program, which holds nothing
# but its stdio (the sockets that carried its job stay behind).
RESERVED = r"""
import asyncio, json, os, time
from corral.sandbox.agent.launcher import LauncherClient

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False

def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [int(p) for p in listed.read().split()]

async def fds_of_a_program(launcher):
    out_r, out_w = os.pipe()
    null = os.open("/dev/null", os.O_RDWR)
    spawned = await launcher.spawn([b"ls", b"/proc/self/fd"], [b"PATH=/usr/bin:/bin"], b"/", (null, out_w, null))
    os.close(out_w)
    os.close(null)
    out = b""
    while chunk := os.read(out_r, 4096):
        out += chunk
    spawned.control.close()
    return sorted(int(name) for name in out.split())

async def main():
    launcher, seen = LauncherClient(), {}
    spare = await launcher.reserve()
    for _ in range(100):  # its child is forked just after the reply
        if children(spare.shepherd):
            break
        await asyncio.sleep(0.02)
    tree = [spare.shepherd, *children(spare.shepherd)]
    seen["alive_while_held"] = [alive(pid) for pid in tree]
    spare.close()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    seen["alive_after_drop"] = [alive(pid) for pid in tree]
    seen["fds_by_launcher"] = await fds_of_a_program(launcher)  # the first: no spare held yet
    await asyncio.sleep(0.5)  # the spare reserved after it is held by now
    seen["held"] = len(launcher.spares.held)
    seen["fds_by_spare"] = await fds_of_a_program(launcher)
    await launcher.close()
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_a_reserved_spare_starts_programs_and_leaves_nothing_when_dropped(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    code, out = runtime.exec(sandbox.id, ["python", "-c", RESERVED], user="corral")
    assert code == 0, out
    seen = json.loads(out.splitlines()[-1])
    assert seen["alive_while_held"] == [True, True]  # the shepherd and its child, forked ahead
    assert seen["alive_after_drop"] == [False, False]
    assert seen["held"] == 2  # two spares held: one for a command that comes at once after another
    # 0-2 the stdio, 3 the directory ls reads: no control or job socket, no launcher socket.
    assert seen["fds_by_launcher"] == seen["fds_by_spare"] == [0, 1, 2, 3]
