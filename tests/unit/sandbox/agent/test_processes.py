"""ProcessTable over a stand-in launcher: real pipes, scripted shepherd events, no Docker."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import reply
from corral.protocol import results as r
from corral.sandbox.agent import process as process_module
from corral.sandbox.agent.launcher import ShepherdEvent, Spawned, SpawnRefused
from corral.sandbox.agent.processes import ProcessSettings, ProcessTable, RunContext, signal_name, signal_number
from corral.sandbox.placeholders import Placeholders

from ..shepherd_fake import QueuedEvents

EXITED = ShepherdEvent("exited", exit_code=0, running=False)


class FakeControl(QueuedEvents):
    """A shepherd's channel: events the test queues, orders it records."""

    def __init__(self) -> None:
        super().__init__()
        self.orders: list[tuple[str, int]] = []
        self.closed = False

    def signal(self, number: int) -> None:
        self.orders.append(("signal", number))

    def kill_tree(self) -> None:
        self.orders.append(("kill_tree", 9))
        self.events.put_nowait(ShepherdEvent("exited", signal=9, running=False))
        self.events.put_nowait(None)

    def close(self) -> None:
        self.closed = True


Behaviour = Callable[[int, int, FakeControl], None]


def prints(out: bytes, err: bytes = b"", *events: ShepherdEvent | None) -> Behaviour:
    """A program that writes ``out`` and ``err``, then exits (or whatever ``events`` say)."""

    def run(stdout: int, stderr: int, control: FakeControl) -> None:
        os.write(stdout, out)
        os.write(stderr, err)
        os.close(stdout)
        os.close(stderr)
        for event in events or (EXITED, None):
            control.events.put_nowait(event)

    return run


class FakeLauncher:
    def __init__(self, behaviour: Behaviour | SpawnRefused) -> None:
        self.behaviour = behaviour
        self.spawned: list[dict[str, Any]] = []
        self.controls: list[FakeControl] = []

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned | SpawnRefused:
        self.spawned.append({"argv": argv, "env": dict(e.decode().split("=", 1) for e in env), "cwd": cwd})
        if isinstance(self.behaviour, SpawnRefused):
            return self.behaviour
        control = FakeControl()
        self.controls.append(control)
        self.behaviour(os.dup(stdio[1]), os.dup(stdio[2]), control)
        return Spawned(4242, control)  # type: ignore[arg-type]

    async def openpty(self) -> tuple[int, int]:
        return os.openpty()

    async def close(self) -> None:
        pass


def table(behaviour: Behaviour | SpawnRefused, **settings: Any) -> tuple[ProcessTable, FakeLauncher]:
    launcher = FakeLauncher(behaviour)
    return ProcessTable(launcher, ProcessSettings(**settings)), launcher  # type: ignore[arg-type]


async def ran(processes: ProcessTable, action: a.ProcessAction, context: RunContext) -> dict[str, Any]:
    """The action's result as the reply carries it."""
    return (await processes.run(action, context)).wire()


def exec_action(**fields: Any) -> a.Exec:
    return a.Exec.model_validate({"type": "exec", "argv": ["prog"], **fields})


async def test_a_foreground_exec_returns_both_streams_and_the_exit() -> None:
    processes, launcher = table(prints(b"out\n", b"err\n"))
    done = await ran(processes, exec_action(), RunContext("a1.x"))
    assert done["stdout"] == "out\n" and done["stderr"] == "err\n"
    assert (done["exit_code"], done["signal"], done["timed_out"]) == (0, None, False)
    assert (done["stdout_truncated"], done["stderr_truncated"]) == (False, False)
    assert launcher.spawned[0]["cwd"] == b"/workspace" and launcher.spawned[0]["argv"] == [b"prog"]
    listed = await ran(processes, a.ProcessList(type="process_list"), RunContext("a2.x"))
    assert listed["processes"][0]["pid"] == 4242 and listed["processes"][0]["running"] is False
    await processes.close()
    assert launcher.controls[0].closed


async def test_output_beyond_the_limit_is_cut_and_flagged() -> None:
    processes, _ = table(prints(b"abcdef", b"xy"))
    done = await ran(processes, exec_action(max_output_bytes=2), RunContext("a1.x"))
    assert (done["stdout"], done["stdout_truncated"], done["stderr"], done["stderr_truncated"]) == (
        "ab",
        True,
        "xy",
        False,
    )
    with pytest.raises(ActionError) as caught:
        await ran(processes, exec_action(max_output_bytes=9 << 20), RunContext("a2.x"))
    assert caught.value.field == "action.max_output_bytes"
    with pytest.raises(ActionError) as caught:
        await ran(processes, exec_action(timeout_ms=600_001), RunContext("a3.x"))
    assert caught.value.field == "action.timeout_ms"


async def test_a_timeout_kills_the_tree_and_keeps_what_was_printed() -> None:
    processes, launcher = table(prints(b"so far", b"", ShepherdEvent("started")))
    done = await ran(processes, exec_action(timeout_ms=1), RunContext("a1.x"))
    assert launcher.controls[0].orders == [("kill_tree", 9)]
    assert (done["timed_out"], done["signal"], done["exit_code"], done["stdout"]) == (True, "SIGKILL", None, "so far")
    assert done["oom_killed"] is None  # killed by us: not the OOM killer's doing, and not known either


async def test_streamed_output_goes_out_as_events_before_the_result() -> None:
    processes, _ = table(prints(b"one", b"two"))
    events: list[dict[str, Any]] = []

    async def emit(event: r.OutputEvent) -> None:
        events.append(event.wire())

    done = await ran(processes, exec_action(stream=True), RunContext("a1.x", emit))
    assert sorted((e["stream"], e["data"]) for e in events) == [("stderr", "two"), ("stdout", "one")]
    assert all(e["event"] == "output" and e["encoding"] == "utf-8" and "ok" not in e for e in events)
    assert done["stdout"] == "one"


async def test_the_command_environment_and_the_callers_env() -> None:
    processes, launcher = table(prints(b""), proxy="corral-proxy:8080", ca_bundle="/etc/ssl/certs/ca-certificates.crt")
    await ran(processes, a.Exec(type="exec", command="true", env={"TERM": "vt100", "X": "1"}), RunContext("a9.b"))
    env = launcher.spawned[0]["env"]
    assert launcher.spawned[0]["argv"] == [b"bash", b"-lc", b"true"]
    assert env["HOME"] == "/home/agent" and env["X"] == "1" and env["TERM"] == "vt100"
    assert env["HTTPS_PROXY"] == "http://corral-action:a9.b@corral-proxy:8080"
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"


async def test_each_exec_gets_the_placeholders_of_the_moment_it_starts() -> None:
    first, second = "corral_secret_" + "1" * 32, "corral_secret_" + "2" * 32
    held = Placeholders({"GITHUB_TOKEN": first, "NPM_TOKEN": second})
    launcher = FakeLauncher(prints(b""))
    processes = ProcessTable(launcher, ProcessSettings(proxy="corral-proxy:8080"), held)  # type: ignore[arg-type]
    await ran(processes, exec_action(env={"NPM_TOKEN": "mine"}), RunContext("a1.x"))
    env = launcher.spawned[0]["env"]
    assert env["GITHUB_TOKEN"] == first and env["TERM"] == "dumb"
    assert env["NPM_TOKEN"] == "mine"  # the request's own env has the last word
    held.replace({"NPM_TOKEN": second})  # the gateway revoked GITHUB_TOKEN
    await ran(processes, exec_action(), RunContext("a2.x"))
    env = launcher.spawned[1]["env"]
    assert "GITHUB_TOKEN" not in env and env["NPM_TOKEN"] == second
    assert env["HTTPS_PROXY"] == "http://corral-action:a2.x@corral-proxy:8080"


@pytest.mark.parametrize(
    ("refused", "fields", "code", "field"),
    [
        (SpawnRefused("cwd", errno.ENOENT, "/no"), {}, ErrorCode.NO_SUCH_FILE, "action.cwd"),
        (SpawnRefused("cwd", errno.ENOTDIR, "/f"), {}, ErrorCode.NOT_A_DIRECTORY, "action.cwd"),
        (SpawnRefused("cwd", errno.EACCES, "/r"), {}, ErrorCode.PERMISSION_DENIED, "action.cwd"),
        (SpawnRefused("exec", errno.ENOENT, "prog"), {}, ErrorCode.PROGRAM_NOT_FOUND, "action.argv"),
        (SpawnRefused("exec", errno.EACCES, "prog"), {}, ErrorCode.PERMISSION_DENIED, "action.argv"),
        (SpawnRefused("exec", errno.ENOEXEC, "prog"), {}, ErrorCode.EXEC_FAILED, "action.argv"),
        (SpawnRefused("setup", errno.EAGAIN, None), {}, ErrorCode.PROCESS_LIMIT, None),
        (SpawnRefused("fork", errno.EAGAIN, None), {}, ErrorCode.PROCESS_LIMIT, None),
    ],
)
async def test_a_program_that_never_ran_is_blamed_on_its_field(
    refused: SpawnRefused, fields: dict[str, Any], code: ErrorCode, field: str | None
) -> None:
    processes, _ = table(refused)
    with pytest.raises(ActionError) as caught:
        await ran(processes, exec_action(**fields), RunContext("a1.x"))
    assert (caught.value.code, caught.value.field) == (code, field)


@pytest.mark.parametrize(
    "action",
    [
        a.ProcessWait(type="process_wait", pid=5),
        a.ProcessKill(type="process_kill", pid=5),
        a.ProcessWrite(type="process_write", pid=5, data="x"),
        a.ProcessOutput(type="process_output", pid=5),
        a.ProcessResize(type="process_resize", pid=5, rows=1, cols=1),
    ],
)
async def test_an_unknown_pid_is_no_such_process(action: a.ProcessAction) -> None:
    processes, _ = table(prints(b""))
    with pytest.raises(ActionError) as caught:
        await ran(processes, action, RunContext("a1.x"))
    assert (caught.value.code, caught.value.field) == (ErrorCode.NO_SUCH_PROCESS, "action.pid")


async def test_kill_signals_the_group_or_kills_the_tree() -> None:
    processes, launcher = table(prints(b"", b"", ShepherdEvent("started")))
    started = await ran(processes, exec_action(background=True), RunContext("a1.x"))
    assert started == {"pid": 4242, "background": True}
    term = await ran(processes, a.ProcessKill(type="process_kill", pid=4242, signal="TERM"), RunContext("a2.x"))
    assert term == {"pid": 4242, "signal": "SIGTERM"}
    await ran(processes, a.ProcessKill(type="process_kill", pid=4242), RunContext("a3.x"))
    assert launcher.controls[0].orders == [("signal", 15), ("kill_tree", 9)]
    waited = await ran(processes, a.ProcessWait(type="process_wait", pid=4242, timeout_ms=1000), RunContext("a4.x"))
    assert waited["signal"] == "SIGKILL" and waited["timed_out"] is False
    with pytest.raises(ActionError) as caught:
        await ran(processes, a.ProcessResize(type="process_resize", pid=4242, rows=2, cols=2), RunContext("a5.x"))
    assert caught.value.code == ErrorCode.INVALID_REQUEST


def test_signals_by_name_or_number() -> None:
    assert signal_number("SIGTERM") == signal_number("term") == signal_number(15) == 15
    assert signal_name(9) == "SIGKILL" and signal_name(None) is None
    with pytest.raises((KeyError, ValueError)):
        signal_number("SIGNOPE")


async def test_a_terminal_that_closed_is_no_stdin_and_its_descriptor_is_closed_once() -> None:
    def terminal(stdout: int, stderr: int, control: FakeControl) -> None:
        os.write(stdout, b"bye\n")
        os.close(stdout)
        os.close(stderr)
        control.events.put_nowait(EXITED)
        control.events.put_nowait(None)

    processes, _ = table(terminal)
    done = await ran(processes, exec_action(pty={"rows": 5, "cols": 20}), RunContext("a1.x"))
    assert done["stdout"] == "bye\r\n" and done["stderr"] == ""
    # The master reads EIO once the slave is gone.
    await asyncio.wait_for(processes.find(4242).outputs["stdout"].closed.wait(), 5)
    reader, writer = os.pipe()  # may take the master's old number: it must survive the table's end
    with pytest.raises(ActionError) as caught:
        await ran(processes, a.ProcessWrite(type="process_write", pid=4242, data="x"), RunContext("a2.x"))
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    await processes.close()
    os.write(writer, b"still mine")
    assert os.read(reader, 20) == b"still mine"
    os.close(reader)
    os.close(writer)


class KeepsStdin(FakeLauncher):
    """A launcher whose program's stdin the test reads (the others' is closed at once)."""

    def __init__(self) -> None:
        super().__init__(lambda out, err, control: (os.close(out), os.close(err)))
        self.stdin: list[int] = []

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned | SpawnRefused:
        self.stdin.append(os.dup(stdio[0]))
        return await super().spawn(argv, env, cwd, stdio, pty=pty)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _read_exactly(fd: int, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < size:
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _settle, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        got += os.read(fd, size - len(got))
    return bytes(got)


async def test_a_private_stdin_is_a_socket_no_one_can_reopen_and_reaches_the_program() -> None:
    launcher = KeepsStdin()
    processes = ProcessTable(launcher, ProcessSettings())  # type: ignore[arg-type]
    started = (await processes.start_private(exec_action(background=True), RunContext("a1.x"))).wire()
    (stdin,) = launcher.stdin
    assert stat.S_ISSOCK(os.fstat(stdin).st_mode)
    with pytest.raises(OSError) as raised:
        os.open(f"/proc/self/fd/{stdin}", os.O_RDWR)
    assert raised.value.errno == errno.ENXIO  # what a process of the agent's gets for /proc/<shell>/fd/0
    await ran(processes, a.ProcessWrite(type="process_write", pid=started["pid"], data="echo hi\n"), RunContext("a2.x"))
    assert await asyncio.wait_for(_read_exactly(stdin, 8), 10) == b"echo hi\n"
    await ran(processes, a.ProcessWrite(type="process_write", pid=started["pid"], eof=True), RunContext("a3.x"))
    assert os.read(stdin, 1) == b""
    os.close(stdin)
    await processes.close()


async def test_two_writes_to_one_stdin_both_finish_in_turn() -> None:
    launcher = KeepsStdin()
    processes = ProcessTable(launcher, ProcessSettings())  # type: ignore[arg-type]
    started = await ran(processes, exec_action(background=True), RunContext("a1.x"))
    big = 300_000  # several pipe-fulls: each write has to wait for the reader
    writes = [
        asyncio.ensure_future(
            ran(processes, a.ProcessWrite(type="process_write", pid=started["pid"], data=c * big), RunContext("a2.x"))
        )
        for c in "xy"
    ]
    writes.append(
        asyncio.ensure_future(
            ran(processes, a.ProcessWrite(type="process_write", pid=started["pid"], eof=True), RunContext("a3.x"))
        )
    )
    read = await asyncio.wait_for(_read_exactly(launcher.stdin[0], 2 * big), 10)
    done = await asyncio.wait_for(asyncio.gather(*writes), 10)
    assert [d["written"] for d in done] == [big, big, 0]
    assert read in (b"x" * big + b"y" * big, b"y" * big + b"x" * big)
    assert os.read(launcher.stdin[0], 1) == b""  # the end of file came after both
    os.close(launcher.stdin[0])
    await processes.close()


def floods(size: int) -> Behaviour:
    """A program that writes ``size`` NUL bytes to each stream (from a thread: more than a pipe holds)."""

    def run(stdout: int, stderr: int, control: FakeControl) -> None:
        loop = asyncio.get_running_loop()

        def write() -> None:
            for fd in (stdout, stderr):
                os.set_blocking(fd, True)
                with contextlib.suppress(BrokenPipeError):
                    os.write(fd, b"\x00" * size)
                os.close(fd)
            for event in (ShepherdEvent("exited", exit_code=0, running=True), None):
                loop.call_soon_threadsafe(control.events.put_nowait, event)

        threading.Thread(target=write, daemon=True).start()

    return run


@pytest.mark.parametrize("encoding", ["utf-8", "base64"])
async def test_an_exec_reply_and_process_output_fit_one_frame(encoding: str) -> None:
    processes, _ = table(floods(8 << 20))
    done = await ran(
        processes,
        exec_action(max_output_bytes=8 << 20, output_encoding=encoding, timeout_ms=30_000),
        RunContext("a1.x"),
    )
    assert len(reply.encode({"ok": True, "id": "r", "result": done})) < 16 << 20
    assert done["stdout_truncated"] and done["stderr_truncated"]
    assert done["stdout"] and done["stderr"]
    asked = a.ProcessOutput(type="process_output", pid=4242, max_bytes=8 << 20, output_encoding=encoding)  # type: ignore[arg-type]
    found = await ran(processes, asked, RunContext("a2.x"))
    assert len(reply.encode({"ok": True, "id": "r", "result": found})) < 16 << 20
    assert 0 < found["next_offset"] - found["offset"] < 8 << 20
    await processes.close()


class NumberedLauncher(FakeLauncher):
    """Each program its own pid."""

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned | SpawnRefused:
        spawned = await super().spawn(argv, env, cwd, stdio, pty=pty)
        assert isinstance(spawned, Spawned)
        return Spawned(1000 + len(self.controls), spawned.control)


async def test_many_processes_hold_no_more_than_the_tables_budget() -> None:
    chunk = b"y" * 60_000

    def chatty(stdout: int, stderr: int, control: FakeControl) -> None:
        os.write(stdout, chunk)
        os.write(stderr, chunk)
        os.close(stdout)
        os.close(stderr)
        control.events.put_nowait(ShepherdEvent("exited", exit_code=0, running=True))

    launcher = NumberedLauncher(chatty)
    settings = ProcessSettings(buffer_bytes=1 << 20, buffers_total_bytes=500_000, captures_total_bytes=300_000)
    processes = ProcessTable(launcher, settings)  # type: ignore[arg-type]
    for n in range(20):
        await ran(processes, exec_action(background=True), RunContext(f"a{n}.x"))
    execs = await asyncio.gather(*(ran(processes, exec_action(), RunContext(f"f{n}.x")) for n in range(5)))
    assert processes.buffered_bytes <= 500_000
    held = sum(len(output.ring) for p in processes.processes() for output in p.outputs.values())
    assert held == processes.buffered_bytes
    kept = sum(len(done["stdout"]) + len(done["stderr"]) for done in execs)
    assert kept <= 300_000 and any(done["stdout_truncated"] or done["stderr_truncated"] for done in execs)
    assert processes.captured_bytes == 0  # each reply gave its bytes back
    await processes.close()


async def test_a_tree_that_outlives_its_kill_still_answers_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stuck(FakeControl):
        def kill_tree(self) -> None:
            self.orders.append(("kill_tree", 9))  # the shepherd never says the tree is gone

    class StuckLauncher(FakeLauncher):
        async def spawn(
            self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
        ) -> Spawned | SpawnRefused:
            spawned = await super().spawn(argv, env, cwd, stdio, pty=pty)
            assert isinstance(spawned, Spawned)
            return Spawned(spawned.pid, Stuck())  # type: ignore[arg-type]

    monkeypatch.setattr(process_module, "KILL_WAIT_S", 0.01)
    launcher = StuckLauncher(prints(b"so far", b"", ShepherdEvent("started")))
    processes = ProcessTable(launcher, ProcessSettings())  # type: ignore[arg-type]
    done = await ran(processes, exec_action(timeout_ms=1), RunContext("a1.x"))
    assert (done["timed_out"], done["stdout"]) == (True, "so far")
    listed = await ran(processes, a.ProcessList(type="process_list"), RunContext("a2.x"))
    assert listed["processes"][0]["running"] is True
    await processes.close()


async def test_starts_side_by_side_cannot_pass_the_process_limit() -> None:
    gate = asyncio.Event()

    class Slow(NumberedLauncher):
        async def spawn(
            self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
        ) -> Spawned | SpawnRefused:
            await gate.wait()
            return await super().spawn(argv, env, cwd, stdio, pty=pty)

    idle: Behaviour = lambda out, err, control: (os.close(out), os.close(err))  # noqa: E731
    processes = ProcessTable(Slow(idle), ProcessSettings(max_processes=2))  # type: ignore[arg-type]
    starts = [
        asyncio.ensure_future(processes.run(exec_action(background=True), RunContext(f"a{n}.x"))) for n in range(3)
    ]
    await asyncio.sleep(0)  # all three reach the launcher (or the limit) before any start is done
    gate.set()
    outcomes = await asyncio.gather(*starts, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, ActionError)]
    assert len(refused) == 1 and refused[0].code == ErrorCode.PROCESS_LIMIT
    await processes.close()


async def test_a_command_too_big_for_the_launchers_message_is_an_invalid_field() -> None:
    processes, launcher = table(prints(b""))
    # Within the action's 96 KiB as UTF-8, not once base64 and JSON (short items grow the most).
    many = exec_action(argv=["true", *["abcdefg"] * 9_999], env={f"V{n:03}": "x" * 10 for n in range(1_000)})
    with pytest.raises(ActionError) as caught:
        await ran(processes, many, RunContext("a1.x"))
    assert (caught.value.code, caught.value.field) == (ErrorCode.INVALID_FIELD, "action.argv")
    big_env = exec_action(argv=["true", *["abcd"] * 9_999], env={f"V{n:04}": "x" * 41 for n in range(1_000)})
    with pytest.raises(ActionError) as caught:
        await ran(processes, big_env, RunContext("a2.x"))
    assert caught.value.field == "action.env"
    assert launcher.spawned == []
