"""The SDK without a gateway: the twins' surfaces are one (and the gateway clients'), the message each
method sends and how its reply is read, alike in both twins."""

from __future__ import annotations

import inspect
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral import commands
from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CommandFailed, CorralError, InvalidRequest
from corral.gateway_client import AsyncGateway, Download, Gateway
from corral.gateway_models import SessionInfo, UploadedFile
from corral.protocol import results as r
from corral.sdk import AsyncExecStream, AsyncFiles, AsyncProcesses, AsyncSandbox, Files, Processes, Sandbox, messages
from corral.sdk.downloads import AsyncDownloads, Downloads
from corral.sdk.pending import Pending
from corral.sdk.previews import AsyncPreviews, Previews

# -- the twins ------------------------------------------------------------------------------------------

# Context-manager dunders differ by name only; everything else public must match one to one.
_ASYNC_NAME = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _surface(cls: type) -> dict[str, Any]:
    """Every public member the class defines or takes from its parts (its bases, ``object`` aside)."""
    own = {name for part in cls.__mro__[:-1] for name in vars(part)}
    names = {n for n in own if not n.startswith("_")} | {"__init__", *_ASYNC_NAME, *_ASYNC_NAME.values()}
    return {name: inspect.getattr_static(cls, name) for name in names if name in own}


# What the async twin gives to iterate with `async for` at once (no await), and the type it returns.
_ITERATED: dict[str, type] = {"exec_stream": AsyncExecStream}
# What the async twin answers as a Pending (awaited, or entered with `async with`, as E2B's create).
_PENDING = {"create", "attach"}
# What does no I/O in either twin (E2B's ``get_host`` is plain in its async SDK too).
_PURE = {"get_host"}


def _plain(annotation: Any) -> str:
    """An annotation (a string: the module has postponed annotations) with the twins' names made one."""
    text = str(annotation).removeprefix("Pending[").removesuffix("]")
    for name in (
        "Sandbox",
        "Gateway",
        "BaseTransport",
        "ExecStream",
        "Processes",
        "Files",
        "Connected",
        "Previews",
        "Downloads",
    ):
        text = text.replace(f"Async{name}", name)
    return text


def _signature(member: Any) -> tuple[Any, ...]:
    function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
    signature = inspect.signature(function)
    parameters = tuple((p.name, p.kind, p.default, _plain(p.annotation)) for p in signature.parameters.values())
    return type(member).__name__, parameters, _plain(signature.return_annotation)


@pytest.mark.parametrize(
    ("sync", "twin"),
    [
        (Sandbox, AsyncSandbox),
        (Gateway, AsyncGateway),
        (Processes, AsyncProcesses),
        (Files, AsyncFiles),
        (Previews, AsyncPreviews),
        (Downloads, AsyncDownloads),
    ],
)
def test_the_async_twin_has_the_same_public_surface(sync: type, twin: type) -> None:
    mine, theirs = _surface(sync), _surface(twin)
    assert {_ASYNC_NAME.get(name, name) for name in mine} == set(theirs)
    for name, member in mine.items():
        other = theirs[_ASYNC_NAME.get(name, name)]
        assert _signature(member) == _signature(other), name
        if callable(getattr(member, "__func__", member)) and name != "__init__":
            # Every call that does I/O is awaited in the twin (a property reads what is already there),
            # but a stream, iterated with `async for` as its sync twin is with `for`.
            function = getattr(other, "__func__", other)
            if name in _PURE:
                assert not inspect.iscoroutinefunction(function), f"{twin.__name__}.{name} does no I/O"
            elif name in _PENDING and twin is AsyncSandbox:
                assert not inspect.iscoroutinefunction(function), f"{twin.__name__}.{name} is awaited"
                assert str(inspect.signature(function).return_annotation).startswith("Pending["), name
            elif name in _ITERATED:
                assert not inspect.iscoroutinefunction(function), f"{twin.__name__}.{name} is awaited"
                assert "__aiter__" in vars(_ITERATED[name]), name
            else:
                assert inspect.iscoroutinefunction(function), f"{twin.__name__}.{name} is not async"


def test_the_surface_comparison_sees_a_missing_method_and_a_changed_default() -> None:
    class Short(AsyncSandbox):
        async def key(self, keys: str, **envelope: Any) -> dict[str, Any]:  # no hold_ms, as AsyncSandbox once had
            raise NotImplementedError

    assert _signature(vars(Short)["key"]) != _signature(_surface(Sandbox)["key"])
    assert set(_surface(Sandbox)) - {"__enter__", "__exit__"} > set(_surface(type("Empty", (), {})))


# -- the messages each method sends, and how the replies are read -----------------------------------------


class Recorder:
    """Stands in for the WebSocket client: keeps each message, answers with ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.sent: list[dict[str, Any]] = []

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(message)
        return self.reply


class AsyncRecorder(Recorder):
    async def request(self, message: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return super().request(message)


INFO = {"id": "ses_1", "ws_url": "ws://gateway.invalid/v1/sessions/ses_1/ws", "container": "corral-ses-1"}


def _sandbox(reply: dict[str, Any]) -> tuple[Sandbox, Recorder]:
    sandbox = Sandbox.__new__(Sandbox)  # no gateway, no WebSocket: only the message side is tested
    sandbox.info, sandbox.id = SessionInfo.model_validate(INFO), "ses_1"
    ws = Recorder(reply)
    sandbox._ws = ws  # type: ignore[assignment]
    return sandbox, ws


def _async_sandbox(reply: dict[str, Any]) -> tuple[AsyncSandbox, Recorder]:
    sandbox = AsyncSandbox.__new__(AsyncSandbox)
    sandbox.info, sandbox.id = SessionInfo.model_validate(INFO), "ses_1"
    ws = AsyncRecorder(reply)
    sandbox._ws = ws  # type: ignore[assignment]
    return sandbox, ws


CLICKED = {"type": "click", "button": "left", "count": 1, "modifiers": []}

# (method, args, kwargs, the message sent)
SENT: list[tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]] = [
    ("click", (), {}, {"action": {"type": "click", "button": "left", "count": 1, "modifiers": []}}),
    (
        "click",
        (10, 20),
        {"button": "middle", "count": 3, "modifiers": ["ctrl"], "screenshot": True},
        {
            "action": {"type": "click", "button": "middle", "count": 3, "modifiers": ["ctrl"], "x": 10, "y": 20},
            "screenshot": True,
        },
    ),
    (
        "double_click",
        (1, 2),
        {},
        {"action": {"type": "click", "button": "left", "count": 2, "modifiers": [], "x": 1, "y": 2}},
    ),
    ("right_click", (), {}, {"action": {"type": "click", "button": "right", "count": 1, "modifiers": []}}),
    ("mouse_down", (), {}, {"action": {"type": "mouse_down", "button": "left"}}),
    ("mouse_up", ("right",), {}, {"action": {"type": "mouse_up", "button": "right"}}),
    ("move", (3, 4), {}, {"action": {"type": "move", "x": 3, "y": 4}}),
    (
        "drag",
        ([(0, 0), (5, 6)],),
        {"wait_for": "stable"},
        {"action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 5, "y": 6}]}, "wait_for": "stable"},
    ),
    (
        "scroll",
        (),
        {"direction": "down", "clicks": 2},
        {"action": {"type": "scroll", "direction": "down", "clicks": 2}},
    ),
    ("scroll", (5, 6), {"dy": -40}, {"action": {"type": "scroll", "x": 5, "y": 6, "dy": -40}}),
    ("type", ("hi",), {}, {"action": {"type": "type", "text": "hi"}}),
    ("key", ("ctrl+a",), {}, {"action": {"type": "key", "keys": "ctrl+a"}}),
    ("key", ("shift",), {"hold_ms": 300}, {"action": {"type": "key", "keys": "shift", "hold_ms": 300}}),
    ("wait", (250,), {}, {"action": {"type": "wait", "ms": 250}}),
    (
        "navigate",
        ("https://example.test/",),
        {"wait_until": "commit"},
        {"action": {"type": "navigate", "url": "https://example.test/", "wait_until": "commit"}},
    ),
    ("back", (), {}, {"action": {"type": "back"}}),
    ("forward", (), {}, {"action": {"type": "forward"}}),
    ("reload", (), {}, {"action": {"type": "reload"}}),
    ("page_info", (), {}, {"action": {"type": "page_info"}}),
    ("tab_new", (), {}, {"action": {"type": "tab_new", "url": None}}),
    ("tab_switch", (1,), {}, {"action": {"type": "tab_switch", "tab": 1}}),
    ("tab_close", ("t2",), {}, {"action": {"type": "tab_close", "tab": "t2"}}),
    (
        "act",
        ({"type": "cursor_position"},),
        {"timeout_ms": 5},
        {"action": {"type": "cursor_position"}, "timeout_ms": 5},
    ),
    ("request", ({"openai": {"type": "wait"}},), {}, {"openai": {"type": "wait"}}),
    ("control", (), {}, {"action": {"type": "control", "wait_ms": 0}}),
    ("control", (), {"wait_ms": 60_000}, {"action": {"type": "control", "wait_ms": 60_000}}),
    ("request_control", ("log in",), {}, {"action": {"type": "request_control", "reason": "log in"}}),
    (
        "request_control",
        ("solve the CAPTCHA",),
        {"wait_ms": 900_000},
        {"action": {"type": "request_control", "reason": "solve the CAPTCHA", "wait_ms": 900_000}},
    ),
    ("click", (1, 2), {"wait_for_control_ms": 5}, {"action": {**CLICKED, "x": 1, "y": 2}, "wait_for_control_ms": 5}),
]


# What each action answers (its result model's wire shape), for the reply each method reads.
PAGE = {"url": "https://example.test/", "title": "t"}
LEASE = {"holder": "agent", "since": 1.0, "help": None, "handed_back": None}
RESULT_OF: dict[str, dict[str, Any]] = {
    "scroll": {"clicks": 2, "direction": "down"},
    "type": {"typed": 2, "via": "x"},
    "key": {},
    "wait": {},
    "navigate": {**PAGE, "status": 200},
    **{kind: PAGE for kind in ("back", "forward", "reload", "page_info")},
    **{kind: {"id": "t1", **PAGE} for kind in ("tab_new", "tab_switch")},
    "tab_close": {"closed": "t2", "tabs": 1},
    **{kind: LEASE for kind in ("control", "request_control")},
}


@pytest.mark.parametrize(("method", "args", "kwargs", "message"), SENT)
async def test_both_twins_send_the_same_message(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: dict[str, Any]
) -> None:
    kind = message.get("action", {}).get("type")
    reply = {"ok": True, "id": 1, "result": RESULT_OF.get(kind, {"x": 1, "y": 2})}
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    assert getattr(sandbox, method)(*args, **kwargs) == await getattr(twin, method)(*args, **kwargs)
    assert ws.sent == twin_ws.sent == [message]


TAB = {"index": 0, "id": "t1", "active": True, "url": "about:blank", "title": ""}
IMAGE = {"ok": True, "id": 1, "result": {}, "screenshot": {"data": "iVBORw=="}}


@pytest.mark.parametrize(
    ("call", "reply", "message", "value"),
    [
        (
            lambda s: s.screenshot("jpeg", quality=50),
            IMAGE,
            {"action": {"type": "screenshot", "format": "jpeg", "quality": 50}},
            b"\x89PNG",
        ),
        (
            lambda s: s.zoom(1, 2, 30, 40, format="jpeg"),
            IMAGE,
            {"action": {"type": "zoom", "region": {"x": 1, "y": 2, "width": 30, "height": 40}, "format": "jpeg"}},
            b"\x89PNG",
        ),
        (
            lambda s: s.cursor_position(),
            {"ok": True, "result": {"x": 7, "y": 8}},
            {"action": {"type": "cursor_position"}},
            (7, 8),
        ),
        (
            lambda s: s.tabs(),
            {"ok": True, "result": {"tabs": [TAB]}},
            {"action": {"type": "tabs"}},
            [r.Tab.model_validate(TAB)],
        ),
        (
            lambda s: s.clipboard_get(),
            {"ok": True, "result": {"text": "copied"}},
            {"action": {"type": "clipboard_get"}},
            "copied",
        ),
        (
            lambda s: s.clipboard_set("x"),
            {"ok": True, "result": {}},
            {"action": {"type": "clipboard_set", "text": "x"}},
            None,
        ),
        (
            lambda s: s.run_anthropic({"action": "screenshot"}, display=(1024, 640)),
            {"ok": True, "result": {"tool_result_content": [{"type": "image"}]}},
            {"anthropic": {"action": "screenshot"}, "display": {"width": 1024, "height": 640}},
            [{"type": "image"}],
        ),
        (
            lambda s: s.run_openai([{"type": "wait"}]),
            {"ok": True, "result": {"output": {"type": "computer_screenshot"}}},
            {"openai": [{"type": "wait"}]},
            {"type": "computer_screenshot"},
        ),
    ],
)
async def test_replies_are_read_the_same_by_both_twins(
    call: Callable[[Any], Any], reply: dict[str, Any], message: dict[str, Any], value: Any
) -> None:
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    assert call(sandbox) == await call(twin) == value
    assert ws.sent == twin_ws.sent == [message]


FAILED = {"ok": False, "id": 1, "error": {"code": "out_of_bounds", "message": "off the screen", "field": "action.x"}}


@pytest.mark.parametrize("method", ["click", "page_info", "screenshot", "clipboard_get", "tabs", "cursor_position"])
async def test_a_failure_reply_raises_action_failed_in_both_twins(method: str) -> None:
    sandbox, _ = _sandbox(FAILED)
    twin, _ = _async_sandbox(FAILED)
    with pytest.raises(ActionFailed) as sync_failure:
        getattr(sandbox, method)()
    with pytest.raises(ActionFailed) as async_failure:
        await getattr(twin, method)()
    for failure in (sync_failure.value, async_failure.value):
        assert (failure.code, failure.field) == ("out_of_bounds", "action.x")
        assert str(failure) == "out_of_bounds: off the screen (field action.x)"


async def test_request_returns_a_failure_as_it_came() -> None:
    sandbox, _ = _sandbox(FAILED)
    twin, _ = _async_sandbox(FAILED)
    assert sandbox.request({"action": {"type": "click"}}) == await twin.request({"action": {"type": "click"}}) == FAILED


def test_messages_are_values() -> None:
    message = messages.key("Return", None, {"screenshot": True})
    assert message.body == {"action": {"type": "key", "keys": "Return"}, "screenshot": True}
    assert message.read({"ok": True, "result": {}}) == r.Done()  # the result model, not the reply
    with pytest.raises(ActionFailed):
        message.read(FAILED)


# -- commands, processes, files ---------------------------------------------------------------------------

EXEC_RESULT = {
    "pid": 7,
    "exit_code": 3,
    "signal": None,
    "stdout": "out",
    "stderr": "err",
    "stdout_truncated": False,
    "stderr_truncated": True,
    "timed_out": False,
    "oom_killed": None,
    "duration_ms": 12.5,
    "encoding": "utf-8",
    "added_later": 1,  # a field this client does not know yet is passed over
}
PROCESS = {
    **{"pid": 9, "command": None, "argv": ["top"], "cwd": "/workspace", "pty": True, "background": True},
    **{"started": 1.0, "running": True, "exit_code": None, "signal": None, "action_id": "a1.1"},
}
SLICE = {"pid": 9, "stream": "stdout", "data": "ab", "encoding": "utf-8", "offset": 4, "next_offset": 6}
SLICE |= {"dropped": 0, "running": True, "exit_code": None}
STAT = {"path": "/a", "name": "a", "type": "file", "size": 1, "mode": "0644", "mtime": 1.0}
ENDED = ExecResult(
    exit_code=3, stdout="out", stderr="err", pid=7, stderr_truncated=True, duration_ms=12.5, oom_killed=None
)


@pytest.mark.parametrize(
    ("call", "result", "action", "value"),
    [
        (
            lambda s: s.exec("echo hi", cwd="/w", env={"A": "1"}, stdin=b"\x00", timeout_ms=5),
            EXEC_RESULT,
            {
                "type": "exec",
                "command": "echo hi",
                "cwd": "/w",
                "env": {"A": "1"},
                "timeout_ms": 5,
                "stdin_base64": "AA==",
            },
            ENDED,
        ),
        (
            lambda s: s.exec(argv=["ls", "-l"], stdin="in", max_output_bytes=10, output_encoding="base64"),
            EXEC_RESULT,
            {"type": "exec", "argv": ["ls", "-l"], "max_output_bytes": 10, "output_encoding": "base64", "stdin": "in"},
            ENDED,
        ),
        (
            lambda s: s.processes.start(argv=["top"], pty=(24, 80)),
            {"pid": 9, "background": True},
            {"type": "exec", "argv": ["top"], "pty": {"rows": 24, "cols": 80}, "background": True},
            9,
        ),
        (
            lambda s: s.processes.list(),
            {"processes": [PROCESS]},
            {"type": "process_list"},
            [r.ProcessInfo.model_validate(PROCESS)],
        ),
        (
            lambda s: s.processes.wait(9, timeout_ms=10),
            {"pid": 9, "exit_code": None, "running": True, "timed_out": True},
            {"type": "process_wait", "pid": 9, "timeout_ms": 10},
            ExecResult(exit_code=None, pid=9, running=True, timed_out=True),
        ),
        (
            lambda s: s.processes.kill(9, "SIGTERM"),
            {"pid": 9, "signal": "SIGTERM"},
            {"type": "process_kill", "pid": 9, "signal": "SIGTERM"},
            r.Signalled(pid=9, signal="SIGTERM"),
        ),
        (
            lambda s: s.processes.write(9, b"\x01", eof=True),
            {"pid": 9, "written": 1},
            {"type": "process_write", "pid": 9, "eof": True, "data_base64": "AQ=="},
            1,
        ),
        (
            lambda s: s.processes.output(9, offset=4, max_bytes=2),
            SLICE,
            {"type": "process_output", "pid": 9, "stream": "stdout", "offset": 4, "max_bytes": 2},
            r.ProcessOutputSlice.model_validate(SLICE),
        ),
        (
            lambda s: s.processes.resize(9, 30, 100),
            {"pid": 9, "rows": 30, "cols": 100},
            {"type": "process_resize", "pid": 9, "rows": 30, "cols": 100},
            r.Resized(pid=9, rows=30, cols=100),
        ),
        (
            lambda s: s.files.read("/a", offset=1, length=2),
            {"path": "/a", "content": "/wA=", "encoding": "base64", "size": 3, "offset": 1, "length": 2, "eof": True},
            {"type": "file_read", "path": "/a", "offset": 1, "encoding": "base64", "length": 2},
            b"\xff\x00",
        ),
        (
            lambda s: s.files.write("/a", b"\x01", make_dirs=True, mode="0600"),
            {"path": "/a", "size": 1, "sha256": "4b"},
            {
                "type": "file_write",
                "path": "/a",
                "append": False,
                "make_dirs": True,
                "content_base64": "AQ==",
                "mode": "0600",
            },
            r.FileWritten(path="/a", size=1, sha256="4b"),
        ),
        (
            lambda s: s.files.write("/a", "text", append=True),
            {"path": "/a", "size": 8, "sha256": "4c"},
            {"type": "file_write", "path": "/a", "append": True, "make_dirs": False, "content": "text"},
            r.FileWritten(path="/a", size=8, sha256="4c"),
        ),
        (
            lambda s: s.files.list("/w", recursive=True, pattern="*.py"),
            {"path": "/w", "entries": [], "truncated": False},
            {"type": "file_list", "path": "/w", "recursive": True, "pattern": "*.py"},
            r.FileListing(path="/w", entries=[], truncated=False),
        ),
        (
            lambda s: s.files.stat("/a"),
            STAT,
            {"type": "file_stat", "path": "/a"},
            r.FileEntry.model_validate(STAT),
        ),
        (
            lambda s: s.files.remove("/d", recursive=True),
            {"path": "/d", "type": "directory"},
            {"type": "file_remove", "path": "/d", "recursive": True},
            r.FileRemoved(path="/d", type="directory"),
        ),
        (
            lambda s: s.files.move("/a", "/b"),
            {"source": "/a", "destination": "/b"},
            {"type": "file_move", "source": "/a", "destination": "/b", "overwrite": False},
            r.FileMoved(source="/a", destination="/b"),
        ),
    ],
)
async def test_commands_and_files_are_the_same_actions_in_both_twins(
    call: Callable[[Any], Any], result: dict[str, Any], action: dict[str, Any], value: Any
) -> None:
    reply = {"ok": True, "id": 1, "result": result}
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    assert call(sandbox) == await call(twin) == value
    assert ws.sent == twin_ws.sent == [{"action": action}]


def test_exec_takes_a_command_or_argv_never_both() -> None:
    sandbox, ws = _sandbox({"ok": True, "id": 1, "result": EXEC_RESULT})
    with pytest.raises(CorralError, match="not both or neither"):
        sandbox.exec("ls", argv=["ls"])
    with pytest.raises(CorralError, match="not both or neither"):
        sandbox.exec()
    assert ws.sent == []


async def test_exec_takes_a_list_as_argv_in_both_twins_and_names_both_forms_for_anything_else() -> None:
    reply = {"ok": True, "id": 1, "result": EXEC_RESULT}
    sandbox, ws = _sandbox(reply)
    twin, twin_ws = _async_sandbox(reply)
    sandbox.exec(["ls", "-la"])
    await twin.exec(("ls", "-la"))
    assert ws.sent == twin_ws.sent == [{"action": {"type": "exec", "argv": ["ls", "-la"]}}]
    # processes.start and exec_stream build the same action.
    assert commands.exec_action(["sleep", "1"], None, background=True) == {
        "type": "exec",
        "argv": ["sleep", "1"],
        "background": True,
    }
    with pytest.raises(InvalidRequest, match="as a list or as argv=, not both") as both:
        sandbox.exec(["ls"], argv=["ls"])
    assert (both.value.code, both.value.field) == ("invalid_request", "argv")
    with pytest.raises(
        CorralError, match=r"a string \(run by bash -lc\) or a list of strings \(argv, no shell\), not int"
    ):
        sandbox.exec(7)  # type: ignore[arg-type]
    with pytest.raises(CorralError, match="not list"):
        sandbox.exec([["ls"]])  # type: ignore[list-item]
    assert len(ws.sent) == 1


async def test_files_read_gives_text_with_format_text_in_both_twins() -> None:
    result = {"path": "/a", "content": "aMOp", "encoding": "base64", "size": 3, "offset": 0, "length": 3, "eof": True}
    sandbox, ws = _sandbox({"ok": True, "id": 1, "result": result})
    twin, twin_ws = _async_sandbox({"ok": True, "id": 1, "result": result})
    assert sandbox.files.read("/a", format="text") == await twin.files.read("/a", format="text") == "hé"
    assert sandbox.files.read("/a") == await twin.files.read("/a", format="bytes") == "hé".encode()
    # The same action either way: the text is decoded here, strictly.
    assert (
        ws.sent
        == twin_ws.sent
        == [{"action": {"type": "file_read", "path": "/a", "offset": 0, "encoding": "base64"}}] * 2
    )
    with pytest.raises(CorralError, match="format is 'bytes' \\(the default\\) or 'text'"):
        sandbox.files.read("/a", format="stream")  # type: ignore[call-overload]
    binary = {**result, "content": "aP8=", "size": 2, "length": 2}
    sandbox, _ = _sandbox({"ok": True, "id": 1, "result": binary})
    with pytest.raises(
        CorralError, match=r"^/a is not UTF-8 text \(byte 1 of what was read is not\): read it with format='bytes'$"
    ):
        sandbox.files.read("/a", format="text")


def test_a_failed_command_is_a_result_and_check_raises_it() -> None:
    sandbox, _ = _sandbox({"ok": True, "id": 1, "result": EXEC_RESULT})
    result = sandbox.exec("false")
    assert (result.ok, result.exit_status()) == (False, 3)
    with pytest.raises(CommandFailed, match="exited 3: err") as failed:
        result.check()
    assert failed.value.result is result and failed.value.status == 3
    assert ExecResult(exit_code=0).check().ok


class StreamRecorder(Recorder):
    """Answers a streamed request with ``frames`` (events, then the reply)."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        super().__init__(frames[-1])
        self.frames = frames

    def stream(self, message: dict[str, Any]) -> Any:
        self.sent.append(message)
        return iter(self.frames)


class AsyncStreamRecorder(StreamRecorder):
    def stream(self, message: dict[str, Any]) -> Any:
        self.sent.append(message)

        async def frames() -> Any:
            for frame in self.frames:
                yield frame

        return frames()


STREAMED = [
    {"id": 1, "event": "output", "stream": "stdout", "data": "a", "encoding": "utf-8"},
    {"id": 1, "event": "output", "stream": "stderr", "data": "/w==", "encoding": "base64"},
    {"ok": True, "id": 1, "result": EXEC_RESULT},
]


async def test_exec_stream_gives_the_chunks_then_the_result_in_both_twins() -> None:
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox._ws, twin._ws = StreamRecorder(STREAMED), AsyncStreamRecorder(STREAMED)  # type: ignore[assignment]
    stream = sandbox.exec_stream(argv=["make"], timeout_ms=9)
    items = list(stream)
    async_stream = twin.exec_stream(argv=["make"], timeout_ms=9)
    async_items = [item async for item in async_stream]  # as the sync one: no await first
    assert items == async_items == [OutputChunk("stdout", "a"), OutputChunk("stderr", "/w==", "base64"), ENDED]
    assert stream.result == async_stream.result == ENDED
    assert items[1].bytes == b"\xff"  # type: ignore[union-attr]
    # The chunks carry every byte: by default the result does not repeat them (as `corral exec`).
    sent = {"action": {"type": "exec", "argv": ["make"], "timeout_ms": 9, "max_output_bytes": 0, "stream": True}}
    assert sandbox._ws.sent == twin._ws.sent == [sent]  # type: ignore[attr-defined]


async def test_an_awaited_async_exec_stream_is_the_same_stream() -> None:
    twin = AsyncSandbox.__new__(AsyncSandbox)
    twin._ws = AsyncStreamRecorder(STREAMED)  # type: ignore[assignment]
    stream = twin.exec_stream(argv=["make"], max_output_bytes=100)
    assert await stream is stream  # code written when exec_stream was a coroutine still runs
    assert [item async for item in await twin.exec_stream(argv=["make"])][-1] == ENDED
    assert twin._ws.sent[0]["action"]["max_output_bytes"] == 100  # type: ignore[attr-defined]


class FilesGateway:
    """Stands in for the gateway's file transfers: keeps each upload, serves one download."""

    def __init__(self, download: bytes, media_type: str) -> None:
        self.uploads: list[tuple[str, str, Path, bool]] = []
        self._download = (download, media_type)

    def upload_file(
        self, session_id: str, remote: str, local: str | Path, *, make_dirs: bool = False, mode: str | None = None
    ) -> UploadedFile:
        self.uploads.append((session_id, remote, Path(local), make_dirs))
        return UploadedFile(path=remote, size=Path(local).stat().st_size, sha256="0" * 64)

    def download_file(self, session_id: str, remote: str, local: str | Path) -> Download:
        Path(local).write_bytes(self._download[0])
        return Download(Path(local), len(self._download[0]), self._download[1])


class AsyncFilesGateway(FilesGateway):
    async def upload_file(  # type: ignore[override]
        self, session_id: str, remote: str, local: str | Path, *, make_dirs: bool = False, mode: str | None = None
    ) -> UploadedFile:
        return super().upload_file(session_id, remote, local, make_dirs=make_dirs, mode=mode)

    async def download_file(self, session_id: str, remote: str, local: str | Path) -> Download:  # type: ignore[override]
        return super().download_file(session_id, remote, local)


def _tar_of(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_upload_and_download_go_through_the_gateway_alike_in_both_twins(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    archive = _tar_of("./x.txt", b"X")
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = "ses_1"
    sandbox._gateway, twin._gateway = (
        FilesGateway(archive, "application/x-tar"),
        AsyncFilesGateway(archive, "application/x-tar"),
    )  # type: ignore[assignment]
    written = sandbox.files.upload(tree, "/workspace/")
    assert written == await twin.files.upload(tree, "/workspace/")
    for gateway in (sandbox._gateway, twin._gateway):
        assert [(remote, make_dirs) for _, remote, _, make_dirs in gateway.uploads] == [  # type: ignore[attr-defined]
            ("/workspace/tree/a.txt", True),
            ("/workspace/tree/sub/b.txt", True),
        ]
    assert sandbox.files.download("/workspace/d", tmp_path / "one") == tmp_path / "one"
    assert await twin.files.download("/workspace/d", tmp_path / "two") == tmp_path / "two"
    assert (tmp_path / "one" / "x.txt").read_bytes() == (tmp_path / "two" / "x.txt").read_bytes() == b"X"
    assert sorted(os.listdir(tmp_path)) == ["one", "tree", "two"]  # no download part left


class StatRecorder(AsyncRecorder):
    """The session's WebSocket answering ``file_stat``: ``/workspace`` is a directory, nothing else is there."""

    def request(self, message: dict[str, Any]) -> Any:  # type: ignore[override]
        self.sent.append(message)
        if message["action"]["path"] == "/workspace":
            entry = {**STAT, "path": "/workspace", "name": "workspace", "type": "directory"}
            return {"ok": True, "id": 1, "result": entry}
        return {"ok": False, "id": 1, "error": {"code": "no_such_file", "message": "no such file"}}


class AsyncStatRecorder(StatRecorder):
    async def request(self, message: dict[str, Any]) -> Any:  # type: ignore[override]
        return StatRecorder.request(self, message)


async def test_a_file_uploaded_to_an_existing_directory_goes_inside_it_in_both_twins(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = "ses_1"
    sandbox._ws, twin._ws = StatRecorder({}), AsyncStatRecorder({})  # type: ignore[assignment]
    sandbox._gateway, twin._gateway = FilesGateway(b"", ""), AsyncFilesGateway(b"", "")  # type: ignore[assignment]
    for remote in ("/workspace", "/workspace/new.txt", "/workspace/"):
        sandbox.files.upload(tmp_path / "a.txt", remote)
        await twin.files.upload(tmp_path / "a.txt", remote)
    for gateway in (sandbox._gateway, twin._gateway):
        assert [remote for _, remote, _, _ in gateway.uploads] == [  # type: ignore[attr-defined]
            "/workspace/a.txt",
            "/workspace/new.txt",
            "/workspace/a.txt",
        ]
    asked = [m["action"]["path"] for m in sandbox._ws.sent]  # type: ignore[attr-defined]
    assert asked == ["/workspace", "/workspace/new.txt"]  # a trailing slash needs no question


class SecretsGateway:
    """Stands in for the gateway's PATCH of secrets: keeps each change, answers the session it makes."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, dict[str, Any]]] = []
        self.placeholders: dict[str, str] = {}

    def update_secrets(self, session_id: str, changes: dict[str, Any]) -> SessionInfo:
        self.changes.append((session_id, changes))
        for name, change in changes.items():
            if change is None:
                self.placeholders.pop(name)
            else:
                self.placeholders.setdefault(name, f"corral_secret_{len(self.placeholders):032x}")
        return SessionInfo(id=session_id, secrets=dict(self.placeholders))


class AsyncSecretsGateway(SecretsGateway):
    async def update_secrets(self, session_id: str, changes: dict[str, Any]) -> SessionInfo:  # type: ignore[override]
        return super().update_secrets(session_id, changes)


async def test_secrets_are_set_and_revoked_alike_in_both_twins() -> None:
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = "ses_1"
    sandbox.info = twin.info = SessionInfo(id="ses_1")
    sandbox._gateway, twin._gateway = SecretsGateway(), AsyncSecretsGateway()  # type: ignore[assignment]
    assert sandbox.secrets == twin.secrets == {}
    placeholder = sandbox.set_secret("TOKEN", "value-1234", allow=["a.test"], in_=["header", "query"])
    assert placeholder == await twin.set_secret("TOKEN", "value-1234", allow=["a.test"], in_=["header", "query"])
    assert sandbox.set_secret("TOKEN", "rotated-1234") == await twin.set_secret("TOKEN", "rotated-1234") == placeholder
    assert sandbox.secrets == twin.secrets == {"TOKEN": placeholder}
    sandbox.revoke_secret("TOKEN")
    await twin.revoke_secret("TOKEN")
    assert sandbox.secrets == twin.secrets == {}
    for gateway in (sandbox._gateway, twin._gateway):
        assert gateway.changes == [  # type: ignore[attr-defined]
            ("ses_1", {"TOKEN": {"value": "value-1234", "allow": ["a.test"], "in": ["header", "query"]}}),
            ("ses_1", {"TOKEN": {"value": "rotated-1234"}}),
            ("ses_1", {"TOKEN": None}),
        ]


class TimeoutGateway:
    """Stands in for the gateway's PATCH of ``timeout_s``: keeps each, answers the new expiry."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def set_timeout(self, session_id: str, timeout_s: int) -> SessionInfo:
        self.asked.append((session_id, timeout_s))
        return SessionInfo(id=session_id, expires_at=1000.0 + timeout_s)


class AsyncTimeoutGateway(TimeoutGateway):
    async def set_timeout(self, session_id: str, timeout_s: int) -> SessionInfo:  # type: ignore[override]
        return super().set_timeout(session_id, timeout_s)


async def test_set_timeout_is_the_same_in_both_twins_and_keeps_the_new_expiry() -> None:
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox.id = twin.id = "ses_1"
    sandbox.info = twin.info = SessionInfo(id="ses_1", expires_at=5.0)
    sandbox._gateway, twin._gateway = TimeoutGateway(), AsyncTimeoutGateway()  # type: ignore[assignment]
    assert sandbox.set_timeout(600) == await twin.set_timeout(600) == 1600.0
    assert sandbox.info.expires_at == twin.info.expires_at == 1600.0
    assert sandbox._gateway.asked == twin._gateway.asked == [("ses_1", 600)]  # type: ignore[attr-defined]


# -- the control lease ------------------------------------------------------------------------------------

HANDED = {"by": "human:lnk_3kq9x0a1b2c4", "note": "logged in", "at": 1733240170.2, "left": False}


async def test_the_last_replys_hand_back_is_read_in_both_twins() -> None:
    sandbox, ws = _sandbox({"ok": True, "id": 1, "result": {"text": "x"}, "control": HANDED})
    twin, twin_ws = _async_sandbox({"ok": True, "id": 1, "result": {"text": "x"}, "control": HANDED})
    assert sandbox.handed_back is None and twin.handed_back is None
    assert sandbox.clipboard_get() == await twin.clipboard_get() == "x"
    assert sandbox.handed_back == twin.handed_back == r.HandBack.model_validate(HANDED)
    ws.reply = twin_ws.reply = {"ok": True, "id": 2, "result": {"text": "y"}}
    sandbox.clipboard_get(), await twin.clipboard_get()
    assert sandbox.handed_back is None and twin.handed_back is None  # the next reply carried none


async def test_a_hand_back_on_a_failure_is_read_though_the_call_raises() -> None:
    refused = {**FAILED, "control": HANDED}
    sandbox, _ = _sandbox(refused)
    twin, _ = _async_sandbox(refused)
    with pytest.raises(ActionFailed):
        sandbox.click()
    with pytest.raises(ActionFailed):
        await twin.click()
    assert sandbox.handed_back == twin.handed_back == r.HandBack.model_validate(HANDED)


async def test_the_sandboxs_wait_for_control_goes_with_every_message_unless_it_says_its_own() -> None:
    sandbox, ws = _sandbox({"ok": True, "id": 1, "result": {"x": 1, "y": 2}})
    twin, twin_ws = _async_sandbox({"ok": True, "id": 1, "result": {"x": 1, "y": 2}})
    assert sandbox.wait_for_control_ms == twin.wait_for_control_ms == 0
    sandbox.wait_for_control_ms = twin.wait_for_control_ms = 30_000
    sandbox.cursor_position(), await twin.cursor_position()
    sandbox.click(wait_for_control_ms=5), await twin.click(wait_for_control_ms=5)
    assert (
        ws.sent
        == twin_ws.sent
        == [
            {"action": {"type": "cursor_position"}, "wait_for_control_ms": 30_000},
            {"action": CLICKED, "wait_for_control_ms": 5},
        ]
    )


async def test_an_exec_streams_reply_hands_back_too_in_both_twins() -> None:
    frames = [*STREAMED[:-1], {**STREAMED[-1], "control": HANDED}]
    sandbox, twin = _sandbox({})[0], _async_sandbox({})[0]
    sandbox._ws, twin._ws = StreamRecorder(frames), AsyncStreamRecorder(frames)  # type: ignore[assignment]
    assert list(sandbox.exec_stream(argv=["make"]))[-1] == [item async for item in twin.exec_stream(argv=["make"])][-1]
    assert sandbox.handed_back == twin.handed_back == r.HandBack.model_validate(HANDED)


class _Box:
    """A stand-in sandbox: counts its starts and ends."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def __aexit__(self, *exc: object) -> None:
        self.log.append("ended")


async def test_a_pending_sandbox_is_awaited_or_entered_and_starts_once() -> None:
    log: list[str] = []

    async def start() -> _Box:
        log.append("started")
        return _Box(log)

    Pending(start)  # never awaited nor entered: nothing starts
    assert log == []
    box = await Pending(start)
    assert isinstance(box, _Box) and log == ["started"]
    with pytest.raises(RuntimeError, match="boom"):
        async with Pending(start) as entered:
            assert isinstance(entered, _Box)
            raise RuntimeError("boom")
    assert log == ["started", "started", "ended"]  # the block's end ends it, an error or not
    twice = Pending(start)
    await twice
    with pytest.raises(CorralError, match="already started"):
        await twice


def test_async_create_and_attach_answer_a_pending_without_starting() -> None:
    # No gateway listens at this address: a Pending that is neither awaited nor entered never calls it.
    assert isinstance(AsyncSandbox.create(url="http://gateway.invalid", api_key="k"), Pending)
    assert isinstance(AsyncSandbox.attach("ses_1", "t", url="http://gateway.invalid"), Pending)
