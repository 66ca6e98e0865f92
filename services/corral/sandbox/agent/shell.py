"""The session's one persistent bash: the native ``shell`` action (docs/protocol.md, "The persistent shell").

The shell is an agent process like any ``exec``'s: a background ``bash --login -s`` that the
:class:`~corral.sandbox.agent.processes.ProcessTable` starts through the launcher, as the agent, in
/workspace, with the environment every command gets. So it counts against the process limit, its
ring against the table's budget, ``process_list`` shows it, and the controller's end kills it.

How a command runs: one script, one line (bash has read all of it before the command starts), is
written to bash's stdin: one end of a socket pair, which no other process can reopen through
/proc/<bash>/fd/0 (ENXIO), and not a terminal (no echo, no ``\\r``, no line discipline cutting long
lines, and programs see what an ``exec`` shows them):

1. the command's stdout and stderr are the one output pipe as kept at a descriptor bash picked at
   start (``__corral_out``, read-only), set for the command alone: one that closed or moved its
   stdout (``exec 1>&-``) does not take the end marker, or the next commands' output, with it.
   With ``split_stderr`` its stderr is bash's own stderr pipe instead, kept at ``__corral_err``
   (read-only too), and the sentinel below is printed there as well, so the controller knows it
   has all of both (the order between the two pipes is lost: the reference bash tool keeps them
   apart the same way);
2. the per-action part of the environment is exported: the proxy variables with *this* action's
   proxy credentials, so the egress audit charges each command's requests to the action that ran it
   (not to the one that started the shell), the CA bundle variables and the secrets' placeholders
   of the moment, and a placeholder's name that is gone since (a secret removed) is unset. The rest
   (PATH, HOME, ...) was set once and is the agent's to change;
3. the command runs by ``eval`` in the shell itself (its ``cd``, ``export`` and functions stay),
   stdin from /dev/null (a command that reads stdin sees its end instead of the script);
4. a sentinel line ``\\n<random token>:<status>\\n`` follows, the token new for each call and
   printed from two halves, so neither a command's output nor bash's own trace (``set -x``) holds
   it by accident.

The command ended when the sentinel arrives, or when bash itself exits (``exit``, ``set -e``).
A background process still holding the pipe does not matter: the end is the sentinel, never the
pipe's end of file. At the timeout (which the script's write is within: a bash that does not read
it, its stdin full, is a command that does not return) the whole tree is killed (the shepherd, as
for an ``exec``) and the next call starts a fresh shell. A restart kills the running tree at once
rather than wait for the lock. What a command prints is kept bounded (:class:`Transcript`).

What this does not guard against: a job a command left running writes into the output (it
inherited it), and a bash subshell a command left in the background keeps bash's saved copy of its stdin
(the ``</dev/null`` redirection's, close-on-exec but inherited by forks; bash offers no way to
close it there) and can race bash for the next script. docs/protocol.md says what is guaranteed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from corral.errors import ActionError, ErrorCode
from corral.protocol import actions as a
from corral.protocol import results as r
from corral.sandbox.agent import agentenv
from corral.sandbox.agent.output import fit, json_size
from corral.sandbox.agent.processes import KILL_WAIT_S, REPLY_TEXT_BYTES, Process, ProcessTable, RunContext

log = logging.getLogger(__name__)

SHELL_ARGV = ("bash", "--login", "-s")  # a login shell, as ``exec``'s ``bash -lc``, reading its stdin
# Run once, first: the stderr pipe kept aside (for split_stderr), stderr joined to stdout (one pipe,
# in order), and a copy of that pipe kept aside.
STARTUP = "exec {__corral_err}>&2 2>&1 {__corral_out}>&1; readonly __corral_out __corral_err\n"
TRUNCATED_NOTE = a.TRUNCATED_NOTE  # after a cut output, as the reference bash tool's
RESTARTED = "tool has been restarted."  # the reference bash tool's answer to restart
SENTINEL_WINDOW = 4096  # the newest bytes kept past the cap: the sentinel line is always among them
MARKER_BYTES = 64  # the sentinel line's most: newline, 32 hex digits, colon, status, newline
BYTES_PER_CHAR = 4  # UTF-8's most: the cap's worth of characters in bytes


@dataclass(frozen=True, slots=True)
class End:
    """A command's end as the transcript saw it: what it printed (whole if ``complete``, else the
    first bytes only) and the status the sentinel carried."""

    output: bytes
    complete: bool
    status: int


class Transcript:
    """What the shell printed since the last command ended, bounded: the first ``keep`` bytes and the
    newest :data:`SENTINEL_WINDOW`, the rest only counted, however much a command prints. Once a
    sentinel is expected, its line ends the command (:attr:`end`); what follows it is kept for the next."""

    def __init__(self, keep: int = a.MAX_TOOL_OUTPUT_CHARS * BYTES_PER_CHAR, window: int = SENTINEL_WINDOW) -> None:
        self._keep = keep
        self._window = window
        self._data = bytearray()
        self._dropped = 0
        self._marker: re.Pattern[bytes] | None = None
        self.end: End | None = None

    @property
    def held(self) -> int:
        """Bytes held now (at most ``keep`` + the window + a chunk)."""
        return len(self._data)

    def holds(self, data: bytes) -> bool:
        """Whether what is held now contains ``data``."""
        return data in self._data

    def expect(self, sentinel: str, keep: int) -> None:
        """The next command's end is ``sentinel``'s line; keep ``keep`` bytes of its output."""
        self._keep = keep
        self._marker = re.compile(b"\n" + re.escape(sentinel.encode()) + rb":(\d{1,3})\n")
        self.end = None
        self._trim()

    def feed(self, chunk: bytes) -> None:
        before = len(self._data)
        self._data += chunk
        if self._marker is not None and self.end is None:
            found = self._marker.search(self._data, max(0, before - MARKER_BYTES))
            if found is not None:
                self.end = End(bytes(self._data[: found.start()]), self._dropped == 0, int(found.group(1)))
                del self._data[: found.end()]
                self._dropped = 0
                self._marker = None
        self._trim()

    def take(self) -> End:
        """Everything held (the shell ended without the sentinel), and a fresh start."""
        taken = End(bytes(self._data), self._dropped == 0, 0)
        self._data.clear()
        self._dropped = 0
        return taken

    def _trim(self) -> None:
        excess = len(self._data) - self._keep - self._window
        if excess > 0:
            del self._data[self._keep : self._keep + excess]
            self._dropped += excess


def sentinel() -> str:
    """A new random token for one command's end (128 bits: no output holds it but by printing it)."""
    return secrets.token_hex(16)


def ansi_c_quoted(text: str) -> str:
    """``text`` as one bash word on one line: ``$'...'`` with newlines and other controls escaped."""
    escaped = "".join(_ANSI_C.get(char) or (f"\\x{ord(char):02x}" if _is_control(char) else char) for char in text)
    return f"$'{escaped}'"


_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _is_control(char: str) -> bool:
    return ord(char) < 0x20 or ord(char) == 0x7F


def script(
    command: str, token: str, exports: Mapping[str, str], unset: Iterable[str] = (), *, split_stderr: bool = False
) -> str:
    """What bash reads to run ``command`` and then say it ended (see the module's docstring): one line,
    so bash has read all of it (the token too) before the command starts, and none of it waits in
    the pipe for another process to take."""
    half = len(token) // 2
    end = f"builtin printf '\\n%s%s:%s\\n' {token[:half]} {token[half:]} \"$__corral_status\""
    stderr = '2>&"$__corral_err"' if split_stderr else "2>&1"
    # The command's own redirections (``exec 1>&-``) end with the group; ``builtin``: a function the
    # agent named printf (or eval, export) does not stand in for them.
    parts = [
        *(f"builtin unset -v {name}" for name in sorted(unset)),
        *(f"builtin export {name}={ansi_c_quoted(value)}" for name, value in exports.items()),
        f"__corral_command={ansi_c_quoted(command)}",
        f'{{ builtin eval -- "$__corral_command" </dev/null; }} 1>&"$__corral_out" {stderr}',
        "__corral_status=$?",
        *([f'{end} 1>&"$__corral_err"'] if split_stderr else []),
        f'{end} 1>&"$__corral_out"',
    ]
    return "; ".join(parts) + "\n"


def per_action(environment: Mapping[str, str]) -> dict[str, str]:
    """The part of a command's environment that changes with the action or the moment (the proxy's
    credentials, the CA bundle, the placeholders): exported before each command. The base (PATH,
    HOME, ...) is the shell's own from its start, and the agent's to change."""
    return {name: value for name, value in environment.items() if name not in agentenv.BASE}


def render(end: End, max_chars: int, budget: int = REPLY_TEXT_BYTES) -> tuple[str, bool]:
    """The output text cut to ``max_chars`` (and its JSON to ``budget`` bytes) with the reference's
    note, and whether it was cut."""
    text, used = fit(end.output, "utf-8", budget)
    truncated = not end.complete or used < len(end.output) or len(text) > max_chars
    return (text[:max_chars] + TRUNCATED_NOTE, True) if truncated else (text, False)


def keep_bytes(max_chars: int) -> int:
    """The bytes that surely hold ``max_chars`` characters, within what one reply carries."""
    return min(max_chars * BYTES_PER_CHAR, REPLY_TEXT_BYTES)


def exit_status(process: Process) -> int | None:
    """A shell's own exit, as bash reports a child's: the code, or 128 + the signal."""
    if process.signal is not None:
        return 128 + process.signal
    return process.exit_code


async def _first(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class PersistentShell:
    """The session's one bash, started on first use. Calls are served one at a time (a lock: two
    commands in one shell at once would mix their output and their state)."""

    def __init__(self, processes: ProcessTable) -> None:
        self._processes = processes
        self._lock = asyncio.Lock()
        self._process: Process | None = None
        self._transcript = Transcript()
        self._errors = Transcript()  # bash's stderr pipe: a split_stderr command's stderr
        self._split = False  # whether the running command's stderr is apart
        self._ended = asyncio.Event()
        self._exported: set[str] = set()  # the per-action names the shell has now (a secret's, once gone, is unset)
        self._preempted: Process | None = None  # the shell a restart killed under a running command

    @property
    def pid(self) -> int | None:
        """The running shell's pid (None before its start and after its end)."""
        return None if self._process is None else self._process.pid

    async def run(self, action: a.Shell, context: RunContext) -> r.ShellOutput:
        most = self._processes.settings.max_timeout_ms  # the cap of an exec's (CORRAL_MAX_ACTION_TIMEOUT_MS)
        if action.timeout_ms > most:
            raise ActionError(ErrorCode.INVALID_FIELD, f"timeout_ms is at most {most}", "action.timeout_ms")
        if action.restart:
            await self._preempt()  # the command running now (even one stuck in its write) ends, and frees the lock
        async with self._lock:
            if action.restart:
                await self._stop()
                await self._start(context.action_id)
                if action.command is None:
                    return r.ShellOutput(output=RESTARTED, exit_code=None, truncated=False, restarted=True)
            process = self._process
            if process is None or process.main_done.is_set():
                await self._stop()
                process = await self._start(context.action_id)
            assert action.command is not None  # the model asks for a command or a restart
            return await self._command(process, action, context.action_id)

    async def _start(self, action_id: str) -> Process:
        context = RunContext(action_id)
        started = await self._processes.start_private(
            a.Exec(type="exec", argv=list(SHELL_ARGV), background=True), context
        )
        self._transcript = Transcript()
        self._errors = Transcript()
        self._exported = set(per_action(self._processes.command_environment(action_id)))  # as it started
        self._process = self._processes.watch(started.pid, self._tap)
        # Written before any command (not as the exec's stdin, which a task feeds: a command could pass it).
        await self._processes.run(a.ProcessWrite(type="process_write", pid=started.pid, data=STARTUP), context)
        return self._process

    def _tap(self, stream: str, chunk: bytes) -> None:
        (self._errors if stream == "stderr" else self._transcript).feed(chunk)
        if self._transcript.end is not None and (not self._split or self._errors.end is not None):
            self._ended.set()

    async def _command(self, process: Process, action: a.Shell, action_id: str) -> r.ShellOutput:
        token = sentinel()
        self._split = action.split_stderr
        self._transcript.expect(token, keep_bytes(action.max_output_chars))
        if self._split:
            self._errors.expect(token, keep_bytes(action.max_output_chars))
        self._ended.clear()
        exports = per_action(self._processes.command_environment(action_id))
        gone, self._exported = self._exported - exports.keys(), set(exports)
        text = script(action.command or "", token, exports, unset=gone, split_stderr=action.split_stderr)
        write = a.ProcessWrite(type="process_write", pid=process.pid, data=text)
        try:
            # The write is within the timeout: bash may not be reading (a profile that blocks, a command
            # fed to it by one of its jobs) and the pipe may be full; the kill below ends it either way.
            async with asyncio.timeout(action.timeout_ms / 1000):
                with contextlib.suppress(ActionError):  # bash closed its stdin: it is ending (a kill, an exit)
                    await self._processes.run(write, RunContext(action_id))
                await _first(self._ended, process.main_done)
        except TimeoutError:
            await self._stop()
            seconds = f"{action.timeout_ms / 1000:g}"
            message = (
                f"timed out: bash has not returned in {seconds} seconds; its processes were killed and the shell "
                "restarted: its working directory, variables and functions are reset"
            )
            raise ActionError(ErrorCode.TIMEOUT, message, "action.timeout_ms") from None
        except BaseException:
            # The caller went away (or the write failed): the command goes, and with it the shell's state.
            await self._stop()
            raise
        return await self._finish(process, action.max_output_chars, action.restart)

    async def _finish(self, process: Process, max_chars: int, restarted: bool) -> r.ShellOutput:
        if self._transcript.end is None:
            process.drain()  # bash exited: the pipe holds the rest of what it printed
        end = self._transcript.end
        if end is not None:
            self._transcript.end = None
            output, truncated = render(end, max_chars)
            stderr, cut = self._stderr(max_chars, output)
            return r.ShellOutput(
                output=output, exit_code=end.status, truncated=truncated or cut, restarted=restarted, stderr=stderr
            )
        # bash itself exited (``exit``, ``set -e``): what it printed, its status, and a fresh shell next time.
        status = exit_status(process)
        output, truncated = render(self._transcript.take(), max_chars)
        stderr, cut = self._stderr(max_chars, output)
        await self._stop()  # what is left of its tree (a job it put in the background) goes with it
        note = f"\nbash has exited with returncode {status}; the next command starts a fresh shell."
        if self._preempted is process:
            note = "\nthe shell was restarted (a call with restart: true): its processes were killed."
        return r.ShellOutput(
            output=output + note, exit_code=status, truncated=truncated or cut, restarted=restarted, stderr=stderr
        )

    def _stderr(self, max_chars: int, output: str) -> tuple[str | None, bool]:
        """A split_stderr command's stderr (None for one whose stderr joined its output), cut so that
        it and ``output`` fit one reply together; and whether it was cut."""
        if not self._split:
            return None, False
        end, self._errors.end = self._errors.end or self._errors.take(), None
        return render(end, max_chars, max(0, REPLY_TEXT_BYTES - json_size(output)))

    async def _preempt(self) -> None:
        """A restart kills the running shell's tree at once, not behind the lock: the command it runs
        (or whose script is stuck in a full pipe) ends now, and its call answers what it printed."""
        process = self._process
        if process is not None and process.running and self._lock.locked():
            self._preempted = process
            await self._processes.run(a.ProcessKill(type="process_kill", pid=process.pid), RunContext(""))

    async def _stop(self) -> None:
        """Kill the shell's whole tree (if it has one) and wait for it to be gone."""
        process, self._process = self._process, None
        if process is None:
            return
        process.tap = None
        if process.running:
            await self._processes.run(a.ProcessKill(type="process_kill", pid=process.pid), RunContext(""))
            try:
                async with asyncio.timeout(KILL_WAIT_S):
                    await process.tree_done.wait()
            except TimeoutError:
                log.warning("the shell %d's tree was not gone %.0f s after its kill", process.pid, KILL_WAIT_S)
        self._transcript = Transcript()
        self._errors = Transcript()
