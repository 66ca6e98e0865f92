"""The persistent shell: its transcript and script (pure), and PersistentShell over a ProcessTable whose
stand-in launcher starts a real local bash (no Docker, no launcher; the sandbox's own is
tests/integration/test_shell.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.sandbox.agent.launcher import ShepherdEvent, Spawned
from corral.sandbox.agent.processes import ProcessSettings, ProcessTable, RunContext
from corral.sandbox.agent.shell import (
    RESTARTED,
    SENTINEL_WINDOW,
    TRUNCATED_NOTE,
    End,
    PersistentShell,
    Transcript,
    per_action,
    render,
    script,
)
from corral.sandbox.placeholders import Placeholders

from ..shepherd_fake import QueuedEvents

TOKEN = "0123456789abcdef" * 2

# -- the transcript ----------------------------------------------------------------------------------------


def test_the_sentinel_line_ends_the_command_with_its_status_and_keeps_what_follows() -> None:
    transcript = Transcript()
    transcript.feed(b"before the command\n")
    transcript.expect(TOKEN, 100)
    transcript.feed(b"out\nerr\n" + f"\n{TOKEN}:3\n".encode() + b"a background job's line")
    assert transcript.end == End(b"before the command\nout\nerr\n", True, 3)
    assert transcript.take() == End(b"a background job's line", True, 0)


@pytest.mark.parametrize("cut", range(1, len(TOKEN) + 5))
def test_a_sentinel_split_across_chunks_is_found(cut: int) -> None:
    transcript = Transcript()
    transcript.expect(TOKEN, 100)
    line = f"no newline at the end\n{TOKEN}:0\n".encode()
    transcript.feed(line[: len(line) - len(TOKEN) - 4 + cut - 1])
    assert transcript.end is None
    transcript.feed(line[len(line) - len(TOKEN) - 4 + cut - 1 :])
    assert transcript.end == End(b"no newline at the end", True, 0)


def test_a_guessed_or_old_sentinel_is_only_output() -> None:
    transcript = Transcript()
    transcript.expect(TOKEN, 1_000)
    forged = f"\n{'f' * 32}:0\n\n{TOKEN[:16]}:0\n{TOKEN}0\n{TOKEN}:\n".encode()
    transcript.feed(forged)
    assert transcript.end is None
    transcript.feed(f"\n{TOKEN}:1\n".encode())
    assert transcript.end == End(forged, True, 1)


def test_a_flood_of_output_keeps_the_cap_and_a_window() -> None:
    transcript = Transcript()
    transcript.expect(TOKEN, 1_000)
    chunk = b"y\n" * 32_768
    for _ in range(2_000):  # 128 MiB
        transcript.feed(chunk)
        assert transcript.held <= 1_000 + SENTINEL_WINDOW + len(chunk)
    transcript.feed(f"\n{TOKEN}:0\n".encode())
    assert transcript.end is not None
    assert not transcript.end.complete
    assert transcript.end.output.startswith(b"y\ny\n")


def test_output_over_the_cap_gets_the_references_note() -> None:
    assert render(End(b"abcdef", True, 0), 6) == ("abcdef", False)
    assert render(End(b"abcdef", True, 0), 3) == ("abc" + TRUNCATED_NOTE, True)
    assert render(End("\u00e9t\u00e9".encode(), False, 0), 10) == ("\u00e9t\u00e9" + TRUNCATED_NOTE, True)
    assert TRUNCATED_NOTE.startswith("<response clipped><NOTE>To save on context only part of this file")


# -- the script ---------------------------------------------------------------------------------------------


def test_the_script_quotes_the_command_and_never_spells_the_sentinel() -> None:
    text = script("echo 'it''s' $HOME; exit", TOKEN, {"HTTPS_PROXY": "http://u:p w@proxy.test:3128"})
    assert TOKEN not in text  # printed from two halves: a trace (set -x) of the script does not hold it
    assert "builtin export HTTPS_PROXY=$'http://u:p w@proxy.test:3128'" in text
    assert "__corral_command=$'echo \\'it\\'\\'s\\' $HOME; exit'" in text
    assert '{ builtin eval -- "$__corral_command" </dev/null; } 1>&"$__corral_out" 2>&1' in text


def test_the_script_is_one_line_whatever_the_command_holds() -> None:
    command = "cat <<'EOF'\nline\tone\r\n\\n \x1b[0m é\nEOF\necho 'it''s'"
    text = script(command, TOKEN, {"A_PLACEHOLDER": "two\nlines"})
    assert text.endswith("\n") and text.count("\n") == 1  # bash reads it whole before the command starts
    assert "__corral_command=$'cat <<\\'EOF\\'\\nline\\tone\\r\\n\\\\n \\x1b[0m é\\nEOF\\n" in text


def test_each_command_is_told_the_per_action_part_of_the_environment() -> None:
    environment = {"PATH": "/bin", "HOME": "/home/agent", "HTTP_PROXY": "http://x", "API_KEY": "corral-ph-1"}
    assert per_action(environment) == {"HTTP_PROXY": "http://x", "API_KEY": "corral-ph-1"}


# -- PersistentShell over a real bash ------------------------------------------------------------------------


class BashControl(QueuedEvents):
    """A shepherd's channel over a local bash in its own process group: its exit, and kill_tree."""

    def __init__(self, child: asyncio.subprocess.Process) -> None:
        super().__init__()
        self.child = child
        self.waiting = asyncio.ensure_future(self._wait())

    async def _wait(self) -> None:
        code = await self.child.wait()
        self.events.put_nowait(
            ShepherdEvent("exited", exit_code=code if code >= 0 else None, signal=-code if code < 0 else None)
        )
        self.events.put_nowait(None)

    def signal(self, number: int) -> None:
        os.killpg(self.child.pid, number)

    def kill_tree(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill_tree()


class BashLauncher:
    """Starts each program for real, in ``cwd`` (the sandbox's /workspace is not here)."""

    def __init__(self, cwd: Path, home: Path | None = None) -> None:
        self.cwd = cwd
        self.home = home  # HOME for the programs (its ~/.bash_profile), else the table's
        self.spawned: list[dict[str, str]] = []
        self.controls: list[BashControl] = []

    async def spawn(
        self, argv: list[bytes], env: list[bytes], cwd: bytes, stdio: tuple[int, int, int], *, pty: bool = False
    ) -> Spawned:
        environment = dict(e.decode().split("=", 1) for e in env)
        if self.home is not None:
            environment["HOME"] = str(self.home)
        self.spawned.append(environment)
        stdin, stdout, stderr = stdio
        child = await asyncio.create_subprocess_exec(
            *argv, stdin=stdin, stdout=stdout, stderr=stderr, env=environment, cwd=self.cwd, start_new_session=True
        )
        control = BashControl(child)
        self.controls.append(control)
        return Spawned(child.pid, control)  # type: ignore[arg-type]

    async def close(self) -> None:
        pass  # the table's end kills through each channel (BashControl.close), as the launcher's shepherds do

    async def clean_up(self) -> None:
        for control in self.controls:
            control.kill_tree()
            await control.waiting


@pytest.fixture
async def shell(tmp_path: Path) -> Any:
    launcher = BashLauncher(tmp_path)
    table = ProcessTable(launcher, ProcessSettings(proxy="proxy.test:3128"))  # type: ignore[arg-type]
    yield PersistentShell(table), table, launcher
    await table.close()
    await launcher.clean_up()


def shell_action(command: str | None = None, **fields: Any) -> a.Shell:
    return a.Shell.model_validate({"type": "shell", "command": command, **fields})


async def run(shell: PersistentShell, command: str | None = None, action_id: str = "act-1", **fields: Any) -> Any:
    """The shell action's result as the reply carries it."""
    return (await shell.run(shell_action(command, **fields), RunContext(action_id))).wire()


async def test_state_survives_between_calls(shell: Any) -> None:
    sh, _, launcher = shell
    await run(sh, 'mkdir -p sub && cd sub && export GREETING=hi && greet() { echo "$GREETING from $1"; }')
    result = await run(sh, 'greet "$(basename "$PWD")"')
    assert result == {"output": "hi from sub\n", "exit_code": 0, "truncated": False, "restarted": False}
    assert len(launcher.spawned) == 1  # one bash for both


async def test_stderr_comes_interleaved_in_order_and_the_status_is_the_commands(shell: Any) -> None:
    sh, _, _ = shell
    result = await run(sh, "echo one; echo two >&2; echo three; (exit 7)")
    assert result["output"] == "one\ntwo\nthree\n"
    assert result["exit_code"] == 7
    assert (await run(sh, "printf 'no newline'"))["output"] == "no newline"


async def test_split_stderr_keeps_stderr_apart_and_whole(shell: Any) -> None:
    # Anthropic's reference bash tool keeps the two apart (and marks a result with stderr an error).
    sh, _, _ = shell
    result = await run(sh, "echo one; echo two >&2; echo three; nope_not_a_command; (exit 7)", split_stderr=True)
    assert result["output"] == "one\nthree\n" and result["exit_code"] == 7
    assert result["stderr"].startswith("two\n") and "nope_not_a_command: command not found" in result["stderr"]
    quiet = await run(sh, "echo only out", split_stderr=True)
    assert (quiet["output"], quiet["stderr"]) == ("only out\n", "")
    # The next command without it: one stream again, and no stderr key in the reply.
    back = await run(sh, "echo back >&2")
    assert back == {"output": "back\n", "exit_code": 0, "truncated": False, "restarted": False}
    # A command that ends bash: what each stream had, and the note.
    ended = await run(sh, "echo bye >&2; exit 3", split_stderr=True)
    assert ended["stderr"] == "bye\n" and ended["exit_code"] == 3


async def test_split_stderr_over_the_cap_is_cut_with_the_note(shell: Any) -> None:
    sh, _, _ = shell
    result = await run(sh, "seq 1 2000 >&2", split_stderr=True, max_output_chars=10)
    assert result["stderr"] == "1\n2\n3\n4\n5\n" + TRUNCATED_NOTE and result["truncated"] is True


@pytest.mark.parametrize(
    "command",
    [
        "cat",  # reads stdin: sees its end at once
        "exec 1>&- 2>&-; echo lost",  # closes the output the sentinel would need
        "exec >/dev/null 2>&1",  # moves it
        "sleep 1000 & echo started",  # a job keeping the pipe open
        "echo; echo '0123456789abcdef0123456789abcdef:0'; set -x",  # a guessed sentinel, and a trace of the script
        "printf() { :; }; eval() { :; }; exec() { :; }; export() { :; }",  # functions named as the script's builtins
        "cat <<'EOF'\nhere $HOME\nEOF\nread line; echo \"read: $?\"",  # a here-document, and a read at stdin's end
    ],
)
async def test_commands_that_fight_the_protocol_end_and_the_shell_goes_on(shell: Any, command: str) -> None:
    sh, _, launcher = shell
    await run(sh, command, timeout_ms=10_000)
    result = await run(sh, "echo still here", timeout_ms=10_000)
    assert "still here\n" in result["output"]
    assert result["exit_code"] == 0
    assert len(launcher.spawned) == 1


async def test_a_command_with_newlines_tabs_and_escapes_runs_verbatim(shell: Any) -> None:
    sh, _, launcher = shell
    text = "cat <<'EOF'\nline\tone\\n \x1b[0m é\nEOF\nprintf '%s|' \"$PWD\" 'it''s'"
    result = await run(sh, text)
    assert result["output"] == f"line\tone\\n \x1b[0m é\n{launcher.cwd}|its|"
    assert len(launcher.spawned) == 1


async def test_no_process_can_reopen_the_shells_stdin_to_feed_it(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sh, _, launcher = shell
    job = "( until [ -e go ]; do sleep 0.01; done; echo 'echo INJECTED' > /proc/$$/fd/0; echo job-done ) &"
    await run(sh, job)  # a job that feeds bash between two calls, while bash waits for its next script
    done = printed(monkeypatch, b"job-done")
    (launcher.cwd / "go").touch()
    await asyncio.wait_for(done.wait(), 10)
    result = await run(sh, "echo next")
    assert "No such device or address" in result["output"]  # a socket: opening it through /proc is ENXIO
    assert "INJECTED" not in result["output"]
    assert result["output"].endswith("job-done\nnext\n")


async def test_a_guessed_sentinel_is_output(shell: Any) -> None:
    sh, _, _ = shell
    result = await run(sh, "printf '\\n%s:0\\n' 0123456789abcdef0123456789abcdef; echo after")
    assert result["output"] == "\n0123456789abcdef0123456789abcdef:0\nafter\n"


async def test_an_exit_ends_the_shell_and_the_next_call_starts_a_fresh_one(shell: Any) -> None:
    sh, _, launcher = shell
    await run(sh, "export KEPT=1")
    result = await run(sh, "echo bye; exit 3")
    assert result["output"].startswith("bye\n")
    assert "bash has exited with returncode 3" in result["output"]
    assert result["exit_code"] == 3
    assert (await run(sh, 'echo "[$KEPT]"'))["output"] == "[]\n"
    assert len(launcher.spawned) == 2


async def test_a_timeout_kills_the_tree_and_the_next_call_runs_in_a_fresh_shell(shell: Any) -> None:
    sh, _, launcher = shell
    await run(sh, "cd / && export KEPT=1")
    with pytest.raises(ActionError) as raised:
        await run(sh, "sleep 1000 & sleep 1000", timeout_ms=300)
    assert raised.value.code == ErrorCode.TIMEOUT
    assert "restarted" in raised.value.message and "reset" in raised.value.message
    assert launcher.controls[0].child.returncode is not None  # bash itself is gone (its group was killed)
    result = await run(sh, 'echo "[$KEPT]"; pwd')
    assert result["output"] == f"[]\n{launcher.cwd}\n"
    assert len(launcher.spawned) == 2


async def test_restart_gives_a_fresh_shell(shell: Any) -> None:
    sh, _, launcher = shell
    await run(sh, "export KEPT=1")
    restarted = {"output": RESTARTED, "exit_code": None, "truncated": False, "restarted": True}
    assert await run(sh, restart=True) == restarted
    result = await run(sh, 'echo "[$KEPT]"', restart=True)
    assert result == {"output": "[]\n", "exit_code": 0, "truncated": False, "restarted": True}
    assert len(launcher.spawned) == 3


async def test_huge_output_is_cut_with_the_note(shell: Any) -> None:
    sh, _, _ = shell
    result = await run(sh, "yes | head -c 5000000", max_output_chars=100)
    assert result["output"] == "y\n" * 50 + TRUNCATED_NOTE
    assert result["truncated"] is True
    assert result["exit_code"] == 0


async def test_each_command_is_charged_to_its_own_action(shell: Any) -> None:
    sh, _, launcher = shell
    first = await run(sh, "echo $HTTPS_PROXY", action_id="act-first")
    second = await run(sh, "echo $HTTPS_PROXY", action_id="act-second")
    assert first["output"] == "http://corral-action:act-first@proxy.test:3128\n"
    assert second["output"] == "http://corral-action:act-second@proxy.test:3128\n"
    assert len(launcher.spawned) == 1


async def test_a_secret_removed_mid_session_is_unset_in_the_shell(tmp_path: Path) -> None:
    first, second = "corral_secret_" + "1" * 32, "corral_secret_" + "2" * 32
    held = Placeholders({"GITHUB_TOKEN": first, "NPM_TOKEN": second})
    launcher = BashLauncher(tmp_path)
    table = ProcessTable(launcher, ProcessSettings(), held)  # type: ignore[arg-type]
    sh = PersistentShell(table)
    try:
        show = 'echo "[${GITHUB_TOKEN-unset}] [${NPM_TOKEN-unset}]"'
        assert (await run(sh, show))["output"] == f"[{first}] [{second}]\n"
        held.replace({"NPM_TOKEN": second})  # the gateway revoked GITHUB_TOKEN
        assert (await run(sh, show))["output"] == f"[unset] [{second}]\n"
        held.replace({})
        assert (await run(sh, show))["output"] == "[unset] [unset]\n"
        assert len(launcher.spawned) == 1
    finally:
        await table.close()
        await launcher.clean_up()


def test_the_script_with_split_stderr_ends_both_streams() -> None:
    text = script("echo hi >&2", TOKEN, {}, split_stderr=True)
    assert '1>&"$__corral_out" 2>&"$__corral_err"' in text and text.count('1>&"$__corral_err"') == 1
    assert "2>&1" not in text and TOKEN not in text


def test_the_script_unsets_the_names_it_is_given() -> None:
    text = script("true", TOKEN, {"NPM_TOKEN": "x"}, unset={"GITHUB_TOKEN"})
    assert text.startswith("builtin unset -v GITHUB_TOKEN; builtin export NPM_TOKEN=$'x'; ")


async def test_calls_at_once_are_served_in_turn(shell: Any) -> None:
    sh, _, _ = shell
    results = await asyncio.gather(*(run(sh, f"echo start {n}; echo end {n}") for n in range(5)))
    assert [r["output"] for r in results] == [f"start {n}\nend {n}\n" for n in range(5)]


async def test_the_shell_is_a_process_of_the_table(shell: Any) -> None:
    sh, table, _ = shell
    await run(sh, "true")
    listed = (await table.run(a.ProcessList(type="process_list"), RunContext("x"))).wire()
    assert [p["pid"] for p in listed["processes"] if p["running"]] == [sh.pid]
    assert listed["processes"][0]["action_id"] == "act-1"


async def test_a_timeout_over_the_execs_cap_is_an_invalid_field(tmp_path: Path) -> None:
    launcher = BashLauncher(tmp_path)
    table = ProcessTable(launcher, ProcessSettings(max_timeout_ms=1_000))  # type: ignore[arg-type]
    with pytest.raises(ActionError) as raised:
        await run(PersistentShell(table), "true", timeout_ms=1_001)
    assert (raised.value.code, raised.value.field) == (ErrorCode.INVALID_FIELD, "action.timeout_ms")
    assert launcher.spawned == []


async def test_the_tables_end_kills_the_shell(shell: Any) -> None:
    sh, table, launcher = shell
    await run(sh, "sleep 1000 &")
    await table.close()  # the controller's end
    (control,) = launcher.controls
    await asyncio.wait_for(control.waiting, 10)
    assert control.child.returncode == -signal.SIGKILL


def printed(monkeypatch: pytest.MonkeyPatch, text: bytes) -> asyncio.Event:
    """Set once a shell prints ``text`` from now on."""
    seen = asyncio.Event()
    feed = Transcript.feed

    def feeding(transcript: Transcript, chunk: bytes) -> None:
        feed(transcript, chunk)
        if transcript.holds(text):
            seen.set()

    monkeypatch.setattr(Transcript, "feed", feeding)
    return seen


async def test_a_script_bash_does_not_read_times_out_and_restart_does_not_wait_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".bash_profile").write_text("[ -e ~/block ] && { echo blocked; sleep 1000; }\n")
    (tmp_path / "block").touch()  # bash never reads its stdin: the script below fills the pipe
    launcher = BashLauncher(tmp_path, home=tmp_path)
    table = ProcessTable(launcher, ProcessSettings())  # type: ignore[arg-type]
    sh = PersistentShell(table)
    try:
        big = "true " + "#" * 90_000  # over a pipe's 64 KiB
        with pytest.raises(ActionError) as raised:
            await asyncio.wait_for(run(sh, big, timeout_ms=300), 10)
        assert raised.value.code == ErrorCode.TIMEOUT
        blocked = printed(monkeypatch, b"blocked")
        stuck = asyncio.ensure_future(run(sh, big, timeout_ms=60_000))
        await blocked.wait()  # the second bash is stuck in its profile, the write too
        (tmp_path / "block").unlink()
        restarted = await asyncio.wait_for(run(sh, "echo fresh", restart=True), 10)
        assert restarted == {"output": "fresh\n", "exit_code": 0, "truncated": False, "restarted": True}
        cut = await asyncio.wait_for(stuck, 10)
        assert "the shell was restarted" in cut["output"], cut
        assert cut["exit_code"] == 128 + signal.SIGKILL
    finally:
        await table.close()
        await launcher.clean_up()


async def test_restart_kills_the_running_command_instead_of_waiting_for_it(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sh, _, launcher = shell
    begun = printed(monkeypatch, b"begun")
    running = asyncio.ensure_future(run(sh, "echo begun; sleep 1000", timeout_ms=60_000))
    await begun.wait()
    restarted = await asyncio.wait_for(run(sh, restart=True), 10)
    assert restarted["output"] == RESTARTED
    cut = await asyncio.wait_for(running, 10)
    assert cut["output"].startswith("begun\n")
    assert "the shell was restarted (a call with restart: true)" in cut["output"]
    assert len(launcher.spawned) == 2
