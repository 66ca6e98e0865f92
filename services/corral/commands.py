"""Commands, processes and files in a sandbox, from the client side: the native actions they are
(pure builders) and what their replies are read as (:class:`ExecResult`, :class:`OutputChunk`).

The SDK's ``sb.exec``, ``sb.exec_stream``, ``sb.processes`` and ``sb.files`` send these; the CLI's
``corral exec`` reads the same results. docs/protocol.md has the actions' fields.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, Self, TypedDict

from corral.client import Frame
from corral.errors import CommandFailed, CorralError, InvalidRequest

TIMEOUT_EXIT = 124  # what timeout(1) exits with; `corral exec` too, for a command that ran out of time


def decode(data: str, encoding: str) -> bytes:
    """Output or file content as sent (``utf-8`` text or ``base64``), as bytes."""
    return base64.b64decode(data) if encoding == "base64" else data.encode()


# -- what replies are read as ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """What a streamed command printed, as it came: ``stream`` is ``stdout`` or ``stderr``."""

    stream: str
    data: str
    encoding: str = "utf-8"

    @classmethod
    def from_event(cls, event: Frame) -> OutputChunk:
        return cls(str(event.get("stream", "stdout")), str(event.get("data", "")), str(event.get("encoding", "utf-8")))

    @property
    def bytes(self) -> bytes:
        return decode(self.data, self.encoding)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How a command ended (``exec``, or ``process_wait`` without the output)."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    pid: int | None = None
    signal: str | None = None  # the signal that ended it ("SIGKILL"), if one did
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    oom_killed: bool | None = None  # None: not known
    duration_ms: float | None = None
    encoding: str = "utf-8"
    running: bool = False  # process_wait only: the wait ran out and the process goes on

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> ExecResult:
        """The reply's ``result``; fields this client does not know are left out (a newer sandbox's),
        so this reads an ``exec``'s and a ``process_wait``'s alike."""
        known = {f.name for f in fields(cls)}
        return cls(**{name: value for name, value in result.items() if name in known})

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_bytes(self) -> bytes:
        return decode(self.stdout, self.encoding)

    @property
    def stderr_bytes(self) -> bytes:
        return decode(self.stderr, self.encoding)

    def exit_status(self) -> int:
        """The status a shell would give: the exit code, 128 + the signal's number, or 124 (timeout)."""
        if self.timed_out:
            return TIMEOUT_EXIT
        if self.exit_code is not None:
            return self.exit_code
        return 128 + _signal_number(self.signal)

    def check(self) -> Self:
        """This result, if the command exited 0 in time; raises :class:`CommandFailed` if not."""
        if not self.ok:
            raise CommandFailed(self.exit_status(), self.stderr, self)
        return self


def _signal_number(name: str | None) -> int:
    try:
        return int(signal.Signals[name or ""])
    except KeyError:
        return 0


# -- the actions (pure) -----------------------------------------------------------------------------------


class Terminal(TypedDict):
    rows: int
    cols: int


class ExecAction(TypedDict, total=False):
    """The ``exec`` action (docs/protocol.md): a command or an argv, and how it runs."""

    type: Literal["exec"]
    command: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    timeout_ms: int
    max_output_bytes: int
    output_encoding: str
    stdin: str
    stdin_base64: str
    stream: bool
    background: bool
    pty: Terminal


class ProcessWriteAction(TypedDict, total=False):
    type: Literal["process_write"]
    pid: int
    eof: bool
    data: str
    data_base64: str


class FileWriteAction(TypedDict, total=False):
    type: Literal["file_write"]
    path: str
    append: bool
    make_dirs: bool
    content: str
    content_base64: str
    mode: int | str


def exec_action(
    command: str | Sequence[str] | None,
    argv: Sequence[str] | None,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | bytes | None = None,
    timeout_ms: int | None = None,
    max_output_bytes: int | None = None,
    output_encoding: str | None = None,
    stream: bool = False,
    background: bool = False,
    pty: tuple[int, int] | None = None,
) -> ExecAction:
    """The ``exec`` action: ``command`` (a string, run by ``bash -lc``; or a list, run as ``argv``) or
    ``argv``, exactly one; what was not given is left out (the sandbox has the defaults)."""
    if command is not None and not isinstance(command, str):
        command, argv = None, _argv_of(command, argv)
    if (command is None) == (argv is None):
        raise CorralError("give a command (a shell string) or argv (a list), not both or neither")
    action: ExecAction = {"type": "exec"}
    if command is not None:
        action["command"] = command
    else:
        action["argv"] = list(argv or [])
    if cwd is not None:
        action["cwd"] = cwd
    if env is not None:
        action["env"] = dict(env)
    if timeout_ms is not None:
        action["timeout_ms"] = timeout_ms
    if max_output_bytes is not None:
        action["max_output_bytes"] = max_output_bytes
    if output_encoding is not None:
        action["output_encoding"] = output_encoding
    action.update(_how(stdin, stream, background, pty))
    return action


def _argv_of(command: object, argv: Sequence[str] | None) -> list[str]:
    """A command given as a list: its argv (no shell), as ``subprocess.run`` takes one. Anything else
    that is no string is refused, naming both forms."""
    if argv is not None:
        raise InvalidRequest("give the command as a list or as argv=, not both", "argv")
    if not isinstance(command, list | tuple) or not all(isinstance(part, str) for part in command):
        raise InvalidRequest(
            f"a command is a string (run by bash -lc) or a list of strings (argv, no shell), not "
            f"{type(command).__name__}",
            "command",
        )
    return list(command)


def _how(stdin: str | bytes | None, stream: bool, background: bool, pty: tuple[int, int] | None) -> ExecAction:
    """An ``exec``'s input and how it runs: only what differs from the sandbox's defaults."""
    how: ExecAction = {}
    if isinstance(stdin, bytes):
        how["stdin_base64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        how["stdin"] = stdin
    if stream:
        how["stream"] = True
    if background:
        how["background"] = True
    if pty is not None:
        how["pty"] = {"rows": pty[0], "cols": pty[1]}
    return how


def process_write_action(pid: int, data: str | bytes, eof: bool) -> ProcessWriteAction:
    action: ProcessWriteAction = {"type": "process_write", "pid": pid, "eof": eof}
    if isinstance(data, bytes):
        action["data_base64"] = base64.b64encode(data).decode()
    else:
        action["data"] = data
    return action


def file_write_action(
    path: str, content: str | bytes, append: bool, mode: int | str | None, make_dirs: bool
) -> FileWriteAction:
    action: FileWriteAction = {"type": "file_write", "path": path, "append": append, "make_dirs": make_dirs}
    if isinstance(content, bytes):
        action["content_base64"] = base64.b64encode(content).decode()
    else:
        action["content"] = content
    if mode is not None:
        action["mode"] = mode
    return action


__all__ = [
    "TIMEOUT_EXIT",
    "ExecAction",
    "ExecResult",
    "FileWriteAction",
    "OutputChunk",
    "ProcessWriteAction",
    "decode",
    "exec_action",
    "file_write_action",
    "process_write_action",
]
