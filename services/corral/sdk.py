"""The Corral SDK: create a session through the gateway and drive it.

    from corral import Sandbox
    with Sandbox.create(allow=["example.com"]) as sb:
        sb.navigate("https://example.com")
        sb.click(100, 200)
        png = sb.screenshot()

Commands and files too (docs/protocol.md):

        result = sb.exec("pytest -q", cwd="/workspace/app").check()
        for item in sb.exec_stream(argv=["make"]):  # OutputChunk as it comes, then the ExecResult
            ...
        pid = sb.processes.start("python -m http.server")
        sb.files.write("/workspace/a.txt", "hi"); sb.files.upload("data.bin", "/workspace/data.bin")

The vendors' tool calls go in whole and come back as the whole result to send to the model
(docs/protocol.md, "Vendor tools"): ``sb.anthropic(tool_use_block)`` gives the ``tool_result``,
``sb.openai(output_item)`` the ``*_output`` item, ``sb.tool_results(reply)`` every result of a whole
Messages or Responses reply, in order. A failed call comes back as the vendor's own error form for
the model to read (``on_error`` hears Corral's structured error); only a call that cannot be read,
or a lost session, raises.

        results = sb.tool_results(client.beta.messages.create(...))  # append as the next user message

A human with a control link may take the session over (docs/protocol.md, "The control lease"):
the agent's calls then raise :class:`ActionFailed` with code ``control_taken``, or wait for the
lease (``sb.wait_for_control_ms``, or ``wait_for_control_ms=`` where a call takes envelope options).
``sb.control(wait_ms=...)`` waits for the hand-back and returns the human's note; ``sb.handed_back``
is the note a call's reply carried; ``sb.request_control(reason)`` asks a human for help.

``AsyncSandbox`` is the same with ``async``/``await``: the same methods with the same parameters
(a unit test holds them to it). ``run_anthropic`` and ``run_openai`` (the computer tool's bare input
and action) return exactly what to send back to each model API.

Every method is one line in each twin: a pure function of :class:`messages` builds the
:class:`Message` to the sandbox and says how its reply is read; the twins only send it, blocking or
awaited. The gateway's HTTP API is :mod:`corral.gateway_client`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from corral import commands, tool_calls, transfer
from corral.client import AsyncSandboxClient, SandboxClient, check_reply, image_bytes, is_reply
from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CommandFailed, ErrorCode, GatewayError
from corral.gateway_client import (
    AsyncGateway,
    Download,
    Gateway,
    api_key,
    gateway_url,
    secret_change,
    session_body,
)
from corral.tool_calls import ModelReply, OnError, ToolCall, Vendored

T = TypeVar("T")


# -- the sandbox's messages and how their replies are read (pure) ---------------------------------------


@dataclass(frozen=True, slots=True)
class Message(Generic[T]):
    """One message to the sandbox and how its reply is read."""

    body: dict[str, Any]
    read: Callable[[dict[str, Any]], T]


def _same(reply: dict[str, Any]) -> dict[str, Any]:
    return reply


def _result(reply: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = check_reply(reply)["result"]
    return result


def _image(reply: dict[str, Any]) -> bytes:
    return image_bytes(check_reply(reply))


def _position(reply: dict[str, Any]) -> tuple[int, int]:
    result = _result(reply)
    return int(result["x"]), int(result["y"])


def _tabs(reply: dict[str, Any]) -> list[dict[str, Any]]:
    tabs: list[dict[str, Any]] = _result(reply)["tabs"]
    return tabs


def _text(reply: dict[str, Any]) -> str:
    return str(_result(reply)["text"])


def _done(reply: dict[str, Any]) -> None:
    check_reply(reply)


def _tool_result(reply: dict[str, Any]) -> list[Any]:
    content: list[Any] = _result(reply)["tool_result_content"]
    return content


def _call_output(reply: dict[str, Any]) -> dict[str, Any]:
    output: dict[str, Any] = _result(reply)["output"]
    return output


def _exec_result(reply: dict[str, Any]) -> ExecResult:
    return ExecResult.from_result(_result(reply))


def _pid(reply: dict[str, Any]) -> int:
    return int(_result(reply)["pid"])


def _processes(reply: dict[str, Any]) -> list[dict[str, Any]]:
    processes: list[dict[str, Any]] = _result(reply)["processes"]
    return processes


def _written(reply: dict[str, Any]) -> int:
    return int(_result(reply)["written"])


def _file_bytes(reply: dict[str, Any]) -> bytes:
    return commands.file_bytes(_result(reply))


def _waiting(body: dict[str, Any], wait_ms: int) -> dict[str, Any]:
    """A message with the sandbox's wait for the control lease (:attr:`Sandbox.wait_for_control_ms`),
    unless it says its own."""
    return body if wait_ms <= 0 or "wait_for_control_ms" in body else {**body, "wait_for_control_ms": wait_ms}


def _hand_back(reply: dict[str, Any]) -> dict[str, Any] | None:
    """The reply's ``control`` member: a human handed the control lease back (``{by, note, at, left}``)."""
    handed = reply.get("control")
    return handed if isinstance(handed, dict) else None


def _display(display: tuple[int, int] | None) -> dict[str, Any]:
    return {} if display is None else {"display": {"width": display[0], "height": display[1]}}


def _given(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _call_envelope(call: ToolCall, display: tuple[int, int] | None, acknowledge: bool) -> dict[str, Any]:
    """A vendor call's envelope: the display the model was told, the safety checks acknowledged
    (OpenAI's only; sent when true, false being the default)."""
    envelope = _display(display)
    if acknowledge and call.dialect == "openai":
        envelope["acknowledge_safety_checks"] = True
    return envelope


class messages:  # a namespace of pure builders, read as messages.click(...)
    """Every message of the SDK's vocabulary, built without sending it."""

    @staticmethod
    def request(message: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message(message, _same)

    @staticmethod
    def act(action: dict[str, Any], envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message({"action": action, **envelope}, check_reply)

    @staticmethod
    def result(action: dict[str, Any]) -> Message[dict[str, Any]]:
        return Message({"action": action}, _result)

    @staticmethod
    def anthropic(tool_input: dict[str, Any], display: tuple[int, int] | None) -> Message[list[Any]]:
        return Message({"anthropic": tool_input, **_display(display)}, _tool_result)

    @staticmethod
    def openai(
        action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None
    ) -> Message[dict[str, Any]]:
        return Message({"openai": action, **_display(display)}, _call_output)

    @staticmethod
    def anthropic_block(
        block: Vendored, display: tuple[int, int] | None, envelope: dict[str, Any], on_error: OnError | None
    ) -> Message[dict[str, Any]]:
        call = tool_calls.anthropic_call(block)
        return messages.tool_call(call, {**_call_envelope(call, display, False), **envelope}, on_error)

    @staticmethod
    def openai_item(
        item: Vendored,
        display: tuple[int, int] | None,
        acknowledge_safety_checks: bool,
        envelope: dict[str, Any],
        on_error: OnError | None,
    ) -> Message[dict[str, Any]]:
        call = tool_calls.openai_call(item)
        return messages.tool_call(
            call, {**_call_envelope(call, display, acknowledge_safety_checks), **envelope}, on_error
        )

    @staticmethod
    def tool_call(call: ToolCall, envelope: dict[str, Any], on_error: OnError | None) -> Message[dict[str, Any]]:
        """One vendor tool call; its reply read as the vendor's result (a failure's error form too)."""

        def read(reply: dict[str, Any]) -> dict[str, Any]:
            return tool_calls.vendor_result(reply, call.result_key, on_error)

        return Message({call.dialect: call.call, **envelope}, read)

    @staticmethod
    def tool_results(
        reply: ModelReply, display: tuple[int, int] | None, acknowledge_safety_checks: bool, on_error: OnError | None
    ) -> list[Message[dict[str, Any]]]:
        """A message per tool call of a whole model reply, in order."""
        return [
            messages.tool_call(call, _call_envelope(call, display, acknowledge_safety_checks), on_error)
            for call in tool_calls.calls_of(reply)
        ]

    @staticmethod
    def screenshot(format: str, options: dict[str, Any]) -> Message[bytes]:
        return Message({"action": {"type": "screenshot", "format": format, **options}}, _image)

    @staticmethod
    def zoom(x: int, y: int, width: int, height: int, options: dict[str, Any]) -> Message[bytes]:
        region = {"x": x, "y": y, "width": width, "height": height}
        return Message({"action": {"type": "zoom", "region": region, **options}}, _image)

    @staticmethod
    def click(
        x: int | None, y: int | None, button: str, count: int, modifiers: Sequence[str], envelope: dict[str, Any]
    ) -> Message[dict[str, Any]]:
        action: dict[str, Any] = {"type": "click", "button": button, "count": count, "modifiers": list(modifiers)}
        if x is not None and y is not None:
            action.update(x=x, y=y)
        return messages.act(action, envelope)

    @staticmethod
    def scroll(
        x: int | None,
        y: int | None,
        direction: str | None,
        clicks: int | None,
        dx: int | None,
        dy: int | None,
        envelope: dict[str, Any],
    ) -> Message[dict[str, Any]]:
        action = {"type": "scroll", **_given(x=x, y=y, direction=direction, clicks=clicks, dx=dx, dy=dy)}
        return messages.act(action, envelope)

    @staticmethod
    def drag(path: Sequence[tuple[int, int]], envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return messages.act({"type": "drag", "path": [{"x": x, "y": y} for x, y in path]}, envelope)

    @staticmethod
    def key(keys: str, hold_ms: int | None, envelope: dict[str, Any]) -> Message[dict[str, Any]]:
        return messages.act({"type": "key", "keys": keys, **_given(hold_ms=hold_ms)}, envelope)

    @staticmethod
    def cursor_position() -> Message[tuple[int, int]]:
        return Message({"action": {"type": "cursor_position"}}, _position)

    @staticmethod
    def tabs() -> Message[list[dict[str, Any]]]:
        return Message({"action": {"type": "tabs"}}, _tabs)

    @staticmethod
    def clipboard_get() -> Message[str]:
        return Message({"action": {"type": "clipboard_get"}}, _text)

    @staticmethod
    def clipboard_set(text: str) -> Message[None]:
        return Message({"action": {"type": "clipboard_set", "text": text}}, _done)

    @staticmethod
    def control(wait_ms: int) -> Message[dict[str, Any]]:
        return messages.result({"type": "control", "wait_ms": wait_ms})

    @staticmethod
    def request_control(reason: str, wait_ms: int | None) -> Message[dict[str, Any]]:
        return messages.result(_given(type="request_control", reason=reason, wait_ms=wait_ms))

    # -- commands, processes, files --------------------------------------------------------------------

    @staticmethod
    def exec(action: dict[str, Any]) -> Message[ExecResult]:
        return Message({"action": action}, _exec_result)

    @staticmethod
    def start(action: dict[str, Any]) -> Message[int]:
        return Message({"action": {**action, "background": True}}, _pid)

    @staticmethod
    def process_list() -> Message[list[dict[str, Any]]]:
        return Message({"action": {"type": "process_list"}}, _processes)

    @staticmethod
    def process_wait(pid: int, timeout_ms: int | None) -> Message[ExecResult]:
        return Message({"action": {"type": "process_wait", "pid": pid, **_given(timeout_ms=timeout_ms)}}, _exec_result)

    @staticmethod
    def process_write(pid: int, data: str | bytes, eof: bool) -> Message[int]:
        return Message({"action": commands.process_write_action(pid, data, eof)}, _written)

    @staticmethod
    def process_output(
        pid: int, stream: str, offset: int, max_bytes: int | None, output_encoding: str | None
    ) -> Message[dict[str, Any]]:
        options = _given(max_bytes=max_bytes, output_encoding=output_encoding)
        action = {"type": "process_output", "pid": pid, "stream": stream, "offset": offset, **options}
        return messages.result(action)

    @staticmethod
    def file_read(path: str, offset: int, length: int | None) -> Message[bytes]:
        action = {"type": "file_read", "path": path, "offset": offset, "encoding": "base64", **_given(length=length)}
        return Message({"action": action}, _file_bytes)

    @staticmethod
    def done(action: dict[str, Any]) -> Message[None]:
        return Message({"action": action}, _done)


# -- commands, processes and files: the helpers behind sb.exec_stream, sb.processes, sb.files -----------


class ExecStream:
    """``for item in sb.exec_stream(...)``: :class:`OutputChunk` as the command prints, then its
    :class:`ExecResult` (last; also kept as :attr:`result`). The command starts when iteration does."""

    def __init__(self, frames: Iterator[dict[str, Any]]) -> None:
        self._frames = frames
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk | ExecResult]:
        for frame in self._frames:
            if is_reply(frame):
                self.result = _exec_result(frame)
                yield self.result
            else:
                yield OutputChunk.from_event(frame)

    def close(self) -> None:
        """Stop reading (the command goes on; its later output is dropped)."""
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()


class AsyncExecStream:
    """The async twin of :class:`ExecStream`: ``async for item in sb.exec_stream(...)`` (the command
    starts at the first item). ``await sb.exec_stream(...)`` gives the same stream, for code written
    when the method was a coroutine."""

    def __init__(self, frames: AsyncIterator[dict[str, Any]]) -> None:
        self._frames = frames
        self.result: ExecResult | None = None

    def __await__(self) -> Generator[Any, None, Self]:
        return self._itself().__await__()

    async def _itself(self) -> Self:
        return self

    async def __aiter__(self) -> AsyncIterator[OutputChunk | ExecResult]:
        async for frame in self._frames:
            if is_reply(frame):
                self.result = _exec_result(frame)
                yield self.result
            else:
                yield OutputChunk.from_event(frame)

    async def aclose(self) -> None:
        close = getattr(self._frames, "aclose", None)
        if close is not None:
            await close()


def _download_part(local: Path) -> Path:
    """A fresh name beside ``local`` for the download to land on before it is settled there."""
    local.parent.mkdir(parents=True, exist_ok=True)
    return local.with_name(f".{local.name}.{secrets.token_hex(6)}.download")


def _is_tree(plan: Sequence[tuple[Path, str]], local: Path) -> bool:
    """Whether an upload plan is a directory's (then every file goes with its directories made)."""
    return not (len(plan) == 1 and plan[0][0] == local)


class Processes:
    """``sb.processes``: commands that run in the background, their input, output and end."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def start(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        pty: tuple[int, int] | None = None,
    ) -> int:
        """Start a command in the background; its pid (``pty``: rows and columns of a terminal)."""
        action = commands.exec_action(command, argv, cwd=cwd, env=env, stdin=stdin, pty=pty)
        return self._sandbox._send(messages.start(action))

    def list(self) -> builtins.list[dict[str, Any]]:
        return self._sandbox._send(messages.process_list())

    def wait(self, pid: int, *, timeout_ms: int | None = None) -> ExecResult:
        """How it ended; ``running`` (and ``timed_out``) when the wait ran out first (it is not killed)."""
        return self._sandbox._send(messages.process_wait(pid, timeout_ms))

    def kill(self, pid: int, signal: str | int = "SIGKILL") -> dict[str, Any]:
        """SIGKILL ends its whole tree; another signal goes to its process group."""
        return self._sandbox._send(messages.result({"type": "process_kill", "pid": pid, "signal": signal}))

    def write(self, pid: int, data: str | bytes, *, eof: bool = False) -> int:
        """Write to its stdin (``eof``: then close it); how many bytes were written."""
        return self._sandbox._send(messages.process_write(pid, data, eof))

    def output(
        self,
        pid: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> dict[str, Any]:
        """What it printed from ``offset`` on (``next_offset`` to go on from, ``dropped`` if the buffer lost some)."""
        return self._sandbox._send(messages.process_output(pid, stream, offset, max_bytes, output_encoding))

    def resize(self, pid: int, rows: int, cols: int) -> None:
        self._sandbox._send(messages.done({"type": "process_resize", "pid": pid, "rows": rows, "cols": cols}))


class AsyncProcesses:
    """The async twin of :class:`Processes`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def start(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        pty: tuple[int, int] | None = None,
    ) -> int:
        action = commands.exec_action(command, argv, cwd=cwd, env=env, stdin=stdin, pty=pty)
        return await self._sandbox._send(messages.start(action))

    async def list(self) -> builtins.list[dict[str, Any]]:
        return await self._sandbox._send(messages.process_list())

    async def wait(self, pid: int, *, timeout_ms: int | None = None) -> ExecResult:
        return await self._sandbox._send(messages.process_wait(pid, timeout_ms))

    async def kill(self, pid: int, signal: str | int = "SIGKILL") -> dict[str, Any]:
        return await self._sandbox._send(messages.result({"type": "process_kill", "pid": pid, "signal": signal}))

    async def write(self, pid: int, data: str | bytes, *, eof: bool = False) -> int:
        return await self._sandbox._send(messages.process_write(pid, data, eof))

    async def output(
        self,
        pid: int,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> dict[str, Any]:
        return await self._sandbox._send(messages.process_output(pid, stream, offset, max_bytes, output_encoding))

    async def resize(self, pid: int, rows: int, cols: int) -> None:
        await self._sandbox._send(messages.done({"type": "process_resize", "pid": pid, "rows": rows, "cols": cols}))


class Files:
    """``sb.files``: files in the sandbox, read and written as the agent. ``read``/``write``/``list``/
    ``stat``/``remove``/``move`` are actions (a reply holds at most 8 MiB of content); ``upload`` and
    ``download`` stream through the gateway's HTTP routes, any size, from and to local files."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def read(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        return self._sandbox._send(messages.file_read(path, offset, length))

    def write(
        self,
        path: str,
        content: str | bytes,
        *,
        append: bool = False,
        mode: int | str | None = None,
        make_dirs: bool = False,
    ) -> dict[str, Any]:
        """Written whole or not at all; ``{"path", "size", "sha256"}``."""
        action = commands.file_write_action(path, content, append, mode, make_dirs)
        return self._sandbox._send(messages.result(action))

    def list(
        self, path: str = ".", *, recursive: bool = False, pattern: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """``{"path", "entries": [{"path", "name", "type", "size", "mode", "mtime"}...], "truncated"}``."""
        options = _given(pattern=pattern, limit=limit)
        return self._sandbox._send(
            messages.result({"type": "file_list", "path": path, "recursive": recursive, **options})
        )

    def stat(self, path: str) -> dict[str, Any]:
        return self._sandbox._send(messages.result({"type": "file_stat", "path": path}))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._sandbox._send(messages.done({"type": "file_remove", "path": path, "recursive": recursive}))

    def move(self, source: str, destination: str, *, overwrite: bool = False) -> None:
        action = {"type": "file_move", "source": source, "destination": destination, "overwrite": overwrite}
        self._sandbox._send(messages.done(action))

    def upload(
        self, local: str | Path, remote: str, *, make_dirs: bool = False, mode: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """A local file, or a directory file by file (its directories made), to ``remote`` (into it when
        it ends with ``/`` or, for a file, is an existing directory, as cp does): one ``{"path", "size",
        "sha256"}`` per file written."""
        if transfer.may_be_directory(Path(local), remote) and self._is_directory(remote):
            remote += "/"
        plan = transfer.upload_plan(Path(local), transfer.remote_target(Path(local), remote))
        tree = _is_tree(plan, Path(local))
        gateway, session = self._sandbox._gateway, self._sandbox.id
        return [
            gateway.upload_file(session, target, source, make_dirs=make_dirs or tree, mode=mode)
            for source, target in plan
        ]

    def _is_directory(self, path: str) -> bool:
        try:
            return bool(self.stat(path).get("type") == "directory")
        except ActionFailed as exc:
            if exc.code == ErrorCode.NO_SUCH_FILE:
                return False
            raise

    def download(self, remote: str, local: str | Path) -> Path:
        """A file to ``local``, or a directory (a tar the sandbox packs) unpacked into ``local``."""
        target = Path(local)
        got = self._sandbox._gateway.download_file(self._sandbox.id, remote, _download_part(target))
        return transfer.settle(got, target)


class AsyncFiles:
    """The async twin of :class:`Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def read(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        return await self._sandbox._send(messages.file_read(path, offset, length))

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        append: bool = False,
        mode: int | str | None = None,
        make_dirs: bool = False,
    ) -> dict[str, Any]:
        action = commands.file_write_action(path, content, append, mode, make_dirs)
        return await self._sandbox._send(messages.result(action))

    async def list(
        self, path: str = ".", *, recursive: bool = False, pattern: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        options = _given(pattern=pattern, limit=limit)
        return await self._sandbox._send(
            messages.result({"type": "file_list", "path": path, "recursive": recursive, **options})
        )

    async def stat(self, path: str) -> dict[str, Any]:
        return await self._sandbox._send(messages.result({"type": "file_stat", "path": path}))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._sandbox._send(messages.done({"type": "file_remove", "path": path, "recursive": recursive}))

    async def move(self, source: str, destination: str, *, overwrite: bool = False) -> None:
        action = {"type": "file_move", "source": source, "destination": destination, "overwrite": overwrite}
        await self._sandbox._send(messages.done(action))

    async def upload(
        self, local: str | Path, remote: str, *, make_dirs: bool = False, mode: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        if transfer.may_be_directory(Path(local), remote) and await self._is_directory(remote):
            remote += "/"
        target = transfer.remote_target(Path(local), remote)
        plan = await asyncio.to_thread(transfer.upload_plan, Path(local), target)
        tree = _is_tree(plan, Path(local))
        gateway, session = self._sandbox._gateway, self._sandbox.id
        return [
            await gateway.upload_file(session, target, source, make_dirs=make_dirs or tree, mode=mode)
            for source, target in plan
        ]

    async def _is_directory(self, path: str) -> bool:
        try:
            return bool((await self.stat(path)).get("type") == "directory")
        except ActionFailed as exc:
            if exc.code == ErrorCode.NO_SUCH_FILE:
                return False
            raise

    async def download(self, remote: str, local: str | Path) -> Path:
        target = Path(local)
        part = await asyncio.to_thread(_download_part, target)
        got: Download = await self._sandbox._gateway.download_file(self._sandbox.id, remote, part)
        return await asyncio.to_thread(transfer.settle, got, target)


# -- the twins ----------------------------------------------------------------------------------------


class Sandbox:
    """A session with its own WebSocket; deleted when the ``with`` block ends."""

    _wait_for_control_ms = 0
    _handed_back: dict[str, Any] | None = None

    def __init__(self, info: dict[str, Any], token: str, gateway: Gateway) -> None:
        self.info = info
        self.id: str = info["id"]
        self._gateway = gateway
        self._ws = SandboxClient(f"{info['ws_url']}?token={token}")
        self._ws.__enter__()

    @classmethod
    def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
        secrets: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Sandbox:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay. ``secrets``: name ->
        ``{"value": ..., "allow": [...], "in": [...]}``; the sandbox gets placeholders (:attr:`secrets`)
        and its proxy puts the values into requests to the bound hosts."""
        gateway = Gateway(url, api_key)
        info: dict[str, Any] | None = None
        try:
            upload = None if hermetic_responses is None else gateway.upload_responses(hermetic_responses)
            try:
                body = session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode, upload, secrets)
                info = gateway.create_session(body)
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        gateway.delete_upload(upload)
            return cls(info, info["token"], gateway)
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError, GatewayError):
                    gateway.delete_session(info["id"])
            gateway.close()
            raise

    @classmethod
    def attach(cls, session_id: str, token: str, *, url: str | None = None) -> Sandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = Gateway(url, token)
        try:
            return cls(gateway.session(session_id), token, gateway)
        except BaseException:
            gateway.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def close(self) -> None:
        """Drop the connection and keep the session running."""
        self._ws.__exit__(None, None, None)
        self._gateway.close()

    def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        self._ws.__exit__(None, None, None)
        try:
            self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return str(self.info["container"])

    def _send(self, message: Message[T]) -> T:
        reply = self._ws.request(_waiting(message.body, self._wait_for_control_ms))
        self._heard(reply)
        return message.read(reply)

    def _heard(self, reply: dict[str, Any]) -> None:
        self._handed_back = _hand_back(reply)

    def _hearing(self, frames: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for frame in frames:
            if is_reply(frame):
                self._heard(frame)
            yield frame

    # -- egress ----------------------------------------------------------------------------------------

    def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info["allow"])

    @property
    def secrets(self) -> dict[str, str]:
        """The session's secrets as the sandbox holds them: name -> placeholder (never a value)."""
        return dict(self.info.get("secrets") or {})

    def set_secret(
        self,
        name: str,
        value: str | None = None,
        *,
        allow: Sequence[str] | None = None,
        in_: Sequence[str] | None = None,
    ) -> str:
        """Add a secret (value and allow) or change one (what is given); needs the owner's API key.
        Returns its placeholder, which stays the same for the session's life."""
        self.info = self._gateway.update_secrets(self.id, {name: secret_change(value, allow, in_)})
        return self.secrets[name]

    def revoke_secret(self, name: str) -> None:
        """The proxy stops putting the secret in; its placeholder is refused from then on."""
        self.info = self._gateway.update_secrets(self.id, {name: None})

    def traffic(self, **filters: str) -> list[dict[str, Any]]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return self._gateway.traffic(self.id, **filters)

    # -- messages --------------------------------------------------------------------------------------

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return self._send(messages.request(message))

    def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return self._send(messages.act(action, envelope))

    def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return self._send(messages.anthropic(tool_input, display))

    def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return self._send(messages.openai(action, display))

    def anthropic(
        self,
        block: Vendored,
        *,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        """The ``tool_result`` block for one Messages ``tool_use`` block (a dict or the SDK's object), ready
        to send back; a failed call's is ``is_error`` with the reason, and ``on_error`` hears Corral's
        error. ``display``: the size the computer tool declared, when it is not the screen's."""
        return self._send(messages.anthropic_block(block, display, envelope, on_error))

    def openai(
        self,
        item: Vendored,
        *,
        acknowledge_safety_checks: bool = False,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        """The input item for one Responses output item (``computer_call``, ``shell_call``,
        ``local_shell_call``, ``apply_patch_call``; a dict or the SDK's object), ready to send back; a
        failed call's in the vendor's error form, and ``on_error`` hears Corral's error.
        ``acknowledge_safety_checks``: a ``computer_call``'s pending checks are acknowledged in the output."""
        return self._send(messages.openai_item(item, display, acknowledge_safety_checks, envelope, on_error))

    def tool_results(
        self,
        reply: ModelReply,
        *,
        display: tuple[int, int] | None = None,
        acknowledge_safety_checks: bool = False,
        on_error: OnError | None = None,
    ) -> list[dict[str, Any]]:
        """The results of every tool call of a whole model reply, in order: a Messages reply's
        ``tool_use`` blocks (the list is the next user message's ``content``) or a Responses reply's
        served output items (the next request's ``input``). ``BetaMessage``/``Response`` or dicts."""
        calls = messages.tool_results(reply, display, acknowledge_safety_checks, on_error)
        return [self._send(message) for message in calls]

    # -- the native vocabulary -------------------------------------------------------------------------

    def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return self._send(messages.screenshot(format, options))

    def zoom(self, x: int, y: int, width: int, height: int, **options: Any) -> bytes:
        return self._send(messages.zoom(x, y, width, height, options))

    def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Any,
    ) -> dict[str, Any]:
        return self._send(messages.click(x, y, button, count, modifiers, envelope))

    def double_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.click(x, y, "left", 2, (), envelope))

    def right_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.click(x, y, "right", 1, (), envelope))

    def mouse_down(self, button: str = "left") -> dict[str, Any]:
        return self._send(messages.act({"type": "mouse_down", "button": button}, {}))

    def mouse_up(self, button: str = "left") -> dict[str, Any]:
        return self._send(messages.act({"type": "mouse_up", "button": button}, {}))

    def move(self, x: int, y: int) -> dict[str, Any]:
        return self._send(messages.act({"type": "move", "x": x, "y": y}, {}))

    def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return self._send(messages.drag(path, envelope))

    def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.act({"type": "type", "text": text}, envelope))

    def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Any) -> dict[str, Any]:
        return self._send(messages.key(keys, hold_ms, envelope))

    def wait(self, ms: int) -> dict[str, Any]:
        return self._send(messages.act({"type": "wait", "ms": ms}, {}))

    def cursor_position(self) -> tuple[int, int]:
        return self._send(messages.cursor_position())

    def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        return self._send(messages.result({"type": "navigate", "url": url, **options}))

    def back(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "back"}))

    def forward(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "forward"}))

    def reload(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "reload"}))

    def page_info(self) -> dict[str, Any]:
        return self._send(messages.result({"type": "page_info"}))

    def tabs(self) -> list[dict[str, Any]]:
        return self._send(messages.tabs())

    def tab_new(self, url: str | None = None) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_new", "url": url}))

    def tab_switch(self, tab: str | int) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_switch", "tab": tab}))

    def tab_close(self, tab: str | int | None = None) -> dict[str, Any]:
        return self._send(messages.result({"type": "tab_close", "tab": tab}))

    def clipboard_get(self) -> str:
        return self._send(messages.clipboard_get())

    def clipboard_set(self, text: str) -> None:
        self._send(messages.clipboard_set(text))

    # -- the control lease (a human's takeover, docs/protocol.md) ---------------------------------------

    @property
    def wait_for_control_ms(self) -> int:
        """How long each request waits while a human holds the control lease before failing with
        ``control_taken`` (0, the default: at once); a request's own ``wait_for_control_ms`` wins."""
        return self._wait_for_control_ms

    @wait_for_control_ms.setter
    def wait_for_control_ms(self, ms: int) -> None:
        self._wait_for_control_ms = ms

    def control(self, wait_ms: int = 0) -> dict[str, Any]:
        """``{holder, since, help, handed_back}``: who holds the control lease, and the human's
        hand-back (``{by, note, at, left}``) if one waits, taken once; with ``wait_ms``, waits that
        long for a human holding it to hand it back."""
        return self._send(messages.control(wait_ms))

    def request_control(self, reason: str, *, wait_ms: int | None = None) -> dict[str, Any]:
        """Ask a human to step in (every viewer shows ``reason``) and wait for the hand-back (up to
        ``wait_ms``; the sandbox's default is 5 minutes): answers as :meth:`control`, with
        ``handed_back`` None when nobody came."""
        return self._send(messages.request_control(reason, wait_ms))

    @property
    def handed_back(self) -> dict[str, Any] | None:
        """The last reply's ``control`` member: a human handed the control lease back (``{by, note,
        at, left}``), or None when that reply carried none. The sandbox sends each hand-back once, on
        the first reply after it (when :meth:`control` did not take it): read it after each call."""
        return self._handed_back

    # -- commands, processes, files --------------------------------------------------------------------

    def exec(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (by ``bash -lc``) or ``argv`` as the agent and wait for it to end; a non-zero
        exit is a result (``.check()`` raises on it), a timeout kills its whole tree (``timed_out``)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
        )
        return self._send(messages.exec(action))

    def exec_stream(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = 0,
        output_encoding: str | None = None,
    ) -> ExecStream:
        """:meth:`exec`, its output given as it comes: iterate for :class:`OutputChunk`, then the result.
        ``max_output_bytes`` defaults to 0, as ``corral exec`` does: the chunks carry every byte, so the
        final result does not repeat them (give a size to have the result hold the output too)."""
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
            stream=True,
        )
        return ExecStream(self._hearing(self._ws.stream(_waiting({"action": action}, self._wait_for_control_ms))))

    @property
    def processes(self) -> Processes:
        return Processes(self)

    @property
    def files(self) -> Files:
        return Files(self)


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: ``async with await AsyncSandbox.create(...) as sb``."""

    _wait_for_control_ms = 0
    _handed_back: dict[str, Any] | None = None

    def __init__(self, info: dict[str, Any], token: str, gateway: AsyncGateway) -> None:
        self.info = info
        self.id: str = info["id"]
        self._gateway = gateway
        self._ws = AsyncSandboxClient(f"{info['ws_url']}?token={token}")  # opened by create/attach

    @classmethod
    async def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
        secrets: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> AsyncSandbox:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay. ``secrets``: name ->
        ``{"value": ..., "allow": [...], "in": [...]}``; the sandbox gets placeholders (:attr:`secrets`)
        and its proxy puts the values into requests to the bound hosts."""
        gateway = AsyncGateway(url, api_key)
        info: dict[str, Any] | None = None
        try:
            upload = None if hermetic_responses is None else await gateway.upload_responses(hermetic_responses)
            try:
                body = session_body(allow, viewport, timeout_s, idle_timeout_s, labels, egress_mode, upload, secrets)
                info = await gateway.create_session(body)
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        await gateway.delete_upload(upload)
            sandbox = cls(info, info["token"], gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError, GatewayError):
                    await gateway.delete_session(info["id"])
            await gateway.close()
            raise

    @classmethod
    async def attach(cls, session_id: str, token: str, *, url: str | None = None) -> AsyncSandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = AsyncGateway(url, token)
        try:
            sandbox = cls(await gateway.session(session_id), token, gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            await gateway.close()
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.delete()

    async def close(self) -> None:
        """Drop the connection and keep the session running."""
        await self._ws.__aexit__(None, None, None)
        await self._gateway.close()

    async def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        await self._ws.__aexit__(None, None, None)
        try:
            await self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            await self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return str(self.info["container"])

    async def _send(self, message: Message[T]) -> T:
        reply = await self._ws.request(_waiting(message.body, self._wait_for_control_ms))
        self._heard(reply)
        return message.read(reply)

    def _heard(self, reply: dict[str, Any]) -> None:
        self._handed_back = _hand_back(reply)

    async def _hearing(self, frames: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        async for frame in frames:
            if is_reply(frame):
                self._heard(frame)
            yield frame

    # -- egress ----------------------------------------------------------------------------------------

    async def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = await self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info["allow"])

    @property
    def secrets(self) -> dict[str, str]:
        """The session's secrets as the sandbox holds them: name -> placeholder (never a value)."""
        return dict(self.info.get("secrets") or {})

    async def set_secret(
        self,
        name: str,
        value: str | None = None,
        *,
        allow: Sequence[str] | None = None,
        in_: Sequence[str] | None = None,
    ) -> str:
        """Add a secret (value and allow) or change one (what is given); needs the owner's API key.
        Returns its placeholder, which stays the same for the session's life."""
        self.info = await self._gateway.update_secrets(self.id, {name: secret_change(value, allow, in_)})
        return self.secrets[name]

    async def revoke_secret(self, name: str) -> None:
        """The proxy stops putting the secret in; its placeholder is refused from then on."""
        self.info = await self._gateway.update_secrets(self.id, {name: None})

    async def traffic(self, **filters: str) -> list[dict[str, Any]]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return await self._gateway.traffic(self.id, **filters)

    # -- messages --------------------------------------------------------------------------------------

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return await self._send(messages.request(message))

    async def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return await self._send(messages.act(action, envelope))

    async def run_anthropic(self, tool_input: dict[str, Any], display: tuple[int, int] | None = None) -> list[Any]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return await self._send(messages.anthropic(tool_input, display))

    async def run_openai(
        self, action: dict[str, Any] | list[dict[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return await self._send(messages.openai(action, display))

    async def anthropic(
        self,
        block: Vendored,
        *,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.anthropic_block(block, display, envelope, on_error))

    async def openai(
        self,
        item: Vendored,
        *,
        acknowledge_safety_checks: bool = False,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.openai_item(item, display, acknowledge_safety_checks, envelope, on_error))

    async def tool_results(
        self,
        reply: ModelReply,
        *,
        display: tuple[int, int] | None = None,
        acknowledge_safety_checks: bool = False,
        on_error: OnError | None = None,
    ) -> list[dict[str, Any]]:
        calls = messages.tool_results(reply, display, acknowledge_safety_checks, on_error)
        return [await self._send(message) for message in calls]

    # -- the native vocabulary -------------------------------------------------------------------------

    async def screenshot(self, format: str = "png", **options: Any) -> bytes:
        return await self._send(messages.screenshot(format, options))

    async def zoom(self, x: int, y: int, width: int, height: int, **options: Any) -> bytes:
        return await self._send(messages.zoom(x, y, width, height, options))

    async def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.click(x, y, button, count, modifiers, envelope))

    async def double_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.click(x, y, "left", 2, (), envelope))

    async def right_click(self, x: int | None = None, y: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.click(x, y, "right", 1, (), envelope))

    async def mouse_down(self, button: str = "left") -> dict[str, Any]:
        return await self._send(messages.act({"type": "mouse_down", "button": button}, {}))

    async def mouse_up(self, button: str = "left") -> dict[str, Any]:
        return await self._send(messages.act({"type": "mouse_up", "button": button}, {}))

    async def move(self, x: int, y: int) -> dict[str, Any]:
        return await self._send(messages.act({"type": "move", "x": x, "y": y}, {}))

    async def drag(self, path: Sequence[tuple[int, int]], **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.drag(path, envelope))

    async def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Any,
    ) -> dict[str, Any]:
        return await self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    async def type(self, text: str, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.act({"type": "type", "text": text}, envelope))

    async def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Any) -> dict[str, Any]:
        return await self._send(messages.key(keys, hold_ms, envelope))

    async def wait(self, ms: int) -> dict[str, Any]:
        return await self._send(messages.act({"type": "wait", "ms": ms}, {}))

    async def cursor_position(self) -> tuple[int, int]:
        return await self._send(messages.cursor_position())

    async def navigate(self, url: str, **options: Any) -> dict[str, Any]:
        return await self._send(messages.result({"type": "navigate", "url": url, **options}))

    async def back(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "back"}))

    async def forward(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "forward"}))

    async def reload(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "reload"}))

    async def page_info(self) -> dict[str, Any]:
        return await self._send(messages.result({"type": "page_info"}))

    async def tabs(self) -> list[dict[str, Any]]:
        return await self._send(messages.tabs())

    async def tab_new(self, url: str | None = None) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_new", "url": url}))

    async def tab_switch(self, tab: str | int) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_switch", "tab": tab}))

    async def tab_close(self, tab: str | int | None = None) -> dict[str, Any]:
        return await self._send(messages.result({"type": "tab_close", "tab": tab}))

    async def clipboard_get(self) -> str:
        return await self._send(messages.clipboard_get())

    async def clipboard_set(self, text: str) -> None:
        await self._send(messages.clipboard_set(text))

    # -- the control lease (a human's takeover, docs/protocol.md) ---------------------------------------

    @property
    def wait_for_control_ms(self) -> int:
        """How long each request waits while a human holds the control lease before failing with
        ``control_taken`` (0, the default: at once); a request's own ``wait_for_control_ms`` wins."""
        return self._wait_for_control_ms

    @wait_for_control_ms.setter
    def wait_for_control_ms(self, ms: int) -> None:
        self._wait_for_control_ms = ms

    async def control(self, wait_ms: int = 0) -> dict[str, Any]:
        """``{holder, since, help, handed_back}``: who holds the control lease, and the human's
        hand-back (``{by, note, at, left}``) if one waits, taken once; with ``wait_ms``, waits that
        long for a human holding it to hand it back."""
        return await self._send(messages.control(wait_ms))

    async def request_control(self, reason: str, *, wait_ms: int | None = None) -> dict[str, Any]:
        """Ask a human to step in (every viewer shows ``reason``) and wait for the hand-back (up to
        ``wait_ms``; the sandbox's default is 5 minutes): answers as :meth:`control`, with
        ``handed_back`` None when nobody came."""
        return await self._send(messages.request_control(reason, wait_ms))

    @property
    def handed_back(self) -> dict[str, Any] | None:
        """The last reply's ``control`` member: a human handed the control lease back (``{by, note,
        at, left}``), or None when that reply carried none. The sandbox sends each hand-back once, on
        the first reply after it (when :meth:`control` did not take it): read it after each call."""
        return self._handed_back

    # -- commands, processes, files --------------------------------------------------------------------

    async def exec(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        output_encoding: str | None = None,
    ) -> ExecResult:
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
        )
        return await self._send(messages.exec(action))

    def exec_stream(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = 0,
        output_encoding: str | None = None,
    ) -> AsyncExecStream:
        action = commands.exec_action(
            command,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            output_encoding=output_encoding,
            stream=True,
        )
        return AsyncExecStream(self._hearing(self._ws.stream(_waiting({"action": action}, self._wait_for_control_ms))))

    @property
    def processes(self) -> AsyncProcesses:
        return AsyncProcesses(self)

    @property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self)


__all__ = [
    "ActionFailed",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncGateway",
    "AsyncProcesses",
    "AsyncSandbox",
    "CommandFailed",
    "ExecResult",
    "ExecStream",
    "Files",
    "Gateway",
    "GatewayError",
    "Message",
    "OutputChunk",
    "Processes",
    "Sandbox",
    "api_key",
    "gateway_url",
    "messages",
]
