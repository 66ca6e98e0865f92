"""The sandbox's messages and how their replies are read (pure): every method of the SDK is one
:class:`Message`, built here without sending it, and sent by a twin, blocking or awaited.

A reply is read as its action's result model (:mod:`corral.protocol.results`), or the one value the
method promises (an image's bytes, a position, a pid); an ``ok: false`` reply raises
:class:`ActionFailed`. Only :meth:`messages.request` and :meth:`messages.act` hand the reply itself
back: they are the doors for any message, whose JSON is open-ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypedDict, TypeVar, cast

from pydantic import BaseModel, ValidationError

from corral import commands, tool_calls
from corral.client import Envelope, Frame, Request, check_reply, image_bytes, message, with_options
from corral.commands import ExecResult
from corral.errors import CorralError, InvalidRequest
from corral.protocol import results as r
from corral.sdk.execution import CodeEvent, Execution, OutputMessage, Result
from corral.tool_calls import ModelReply, OnError, ToolCall, Vendored

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ShotOptions(TypedDict, total=False):
    """How a screenshot or a zoom is encoded (``format`` is its own parameter)."""

    quality: int
    scale: float
    width: int
    region: Mapping[str, int]
    cursor: bool


class ZoomOptions(TypedDict, total=False):
    """How a zoom is encoded (its ``width`` is the region's: an output width is a screenshot's option)."""

    format: Literal["png", "jpeg", "webp"]
    quality: int
    cursor: bool


class PageOptions(TypedDict, total=False):
    """How ``navigate`` waits."""

    wait_until: Literal["commit", "domcontentloaded", "load", "networkidle"]
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Message(Generic[T]):
    """One message to the sandbox and how its reply is read."""

    body: Request
    read: Callable[[Frame], T]


def utf8_text(path: str, content: bytes) -> str:
    """A file's bytes as text; the byte where they stop being UTF-8 and the way to read them otherwise."""
    try:
        return content.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"{path} is not UTF-8 text (byte {exc.start} of what was read is not): read it with format='bytes'",
            "format",
        ) from None


def model_of(result: object, model: type[M]) -> M:
    """A reply's ``result`` as ``model``; a result this client cannot read is a :class:`CorralError`
    naming the model (a sandbox of another version), never pydantic's own error."""
    try:
        return model.model_validate(result)
    except ValidationError as exc:
        raise CorralError(f"the sandbox's result is no {model.__name__} ({exc.error_count()} problems)") from None


def reading(model: type[M]) -> Callable[[Frame], M]:
    """The reader of an ``ok`` reply's ``result`` as ``model``."""

    def read(reply: Frame) -> M:
        return model_of(check_reply(reply).get("result"), model)

    return read


def _then(model: type[M], pick: Callable[[M], T]) -> Callable[[Frame], T]:
    """The reader of an ``ok`` reply's ``result`` as ``model``, then the one value the method gives."""
    read = reading(model)
    return lambda reply: pick(read(reply))


def _image(reply: Frame) -> bytes:
    return image_bytes(check_reply(reply))


def exec_result(reply: Frame) -> ExecResult:
    result = check_reply(reply).get("result")
    return ExecResult.from_result(result if isinstance(result, Mapping) else {})


def code_event(frame: Frame) -> CodeEvent:
    """A streamed ``run_code``'s event frame (before its reply), read as its model: a printed chunk
    (:class:`~corral.protocol.results.OutputEvent`, as :class:`OutputMessage`) or a displayed result
    (:class:`~corral.protocol.results.CodeResultEvent`, as :class:`Result`)."""
    if frame.get("event") == "result":
        return Result.of(model_of(frame, r.CodeResultEvent).result)
    chunk = model_of(frame, r.OutputEvent)
    line = (
        chunk.data
        if chunk.encoding == "utf-8"
        else commands.decode(chunk.data, chunk.encoding).decode(errors="replace")
    )
    return OutputMessage(line, time.time_ns(), chunk.stream == "stderr")


def _vendor(key: str) -> Callable[[Frame], Any]:
    """The reader of a computer-tool call's vendor JSON (``tool_result_content``, ``output``): open-ended."""
    return lambda reply: check_reply(reply)["result"][key]


def _display(display: tuple[int, int] | None) -> Request:
    return {} if display is None else {"display": {"width": display[0], "height": display[1]}}


def _given(**fields: object) -> dict[str, object]:
    return {name: value for name, value in fields.items() if value is not None}


def _call_envelope(call: ToolCall, display: tuple[int, int] | None, acknowledge: bool) -> Request:
    """A vendor call's envelope: the display the model was told, the safety checks acknowledged
    (OpenAI's only; sent when true, false being the default)."""
    envelope = _display(display)
    if acknowledge and call.dialect == "openai":
        envelope["acknowledge_safety_checks"] = True
    return envelope


def _of(model: type[M], action: Mapping[str, object], envelope: Envelope | None = None) -> Message[M]:
    return Message(message(action, envelope or {}), reading(model))


class messages:  # a namespace of pure builders, read as messages.click(...)
    """Every message of the SDK's vocabulary, built without sending it."""

    # -- the doors for any message, and the vendors' calls --------------------------------------------

    @staticmethod
    def request(message: dict[str, Any]) -> Message[dict[str, Any]]:
        """Any message as it is (the caller's keys, a malformed one too), its reply as it came."""
        return Message(cast(Request, message), lambda reply: cast(dict[str, Any], reply))

    @staticmethod
    def act(action: Mapping[str, Any], envelope: Envelope) -> Message[Frame]:
        return Message(message(action, envelope), check_reply)

    @staticmethod
    def anthropic(tool_input: Mapping[str, Any], display: tuple[int, int] | None) -> Message[list[dict[str, Any]]]:
        return Message({"anthropic": tool_input, **_display(display)}, _vendor("tool_result_content"))

    @staticmethod
    def openai(
        action: Mapping[str, Any] | list[Mapping[str, Any]], display: tuple[int, int] | None
    ) -> Message[dict[str, Any]]:
        return Message({"openai": action, **_display(display)}, _vendor("output"))

    @staticmethod
    def anthropic_block(
        block: Vendored, display: tuple[int, int] | None, envelope: Envelope, on_error: OnError | None
    ) -> Message[dict[str, Any]]:
        call = tool_calls.anthropic_call(block)
        return messages.tool_call(call, with_options(_call_envelope(call, display, False), envelope), on_error)

    @staticmethod
    def openai_item(
        item: Vendored, display: tuple[int, int] | None, acknowledge: bool, envelope: Envelope, on_error: OnError | None
    ) -> Message[dict[str, Any]]:
        call = tool_calls.openai_call(item)
        return messages.tool_call(call, with_options(_call_envelope(call, display, acknowledge), envelope), on_error)

    @staticmethod
    def tool_call(call: ToolCall, envelope: Request, on_error: OnError | None) -> Message[dict[str, Any]]:
        """One vendor tool call; its reply read as the vendor's result (a failure's error form too)."""

        def read(reply: Frame) -> dict[str, Any]:
            return tool_calls.vendor_result(reply, call.result_key, on_error)

        body = envelope.copy()
        if call.dialect == "anthropic":
            body["anthropic"] = call.call
        else:
            body["openai"] = call.call
        return Message(body, read)

    @staticmethod
    def tool_results(
        reply: ModelReply, display: tuple[int, int] | None, acknowledge: bool, on_error: OnError | None
    ) -> list[Message[dict[str, Any]]]:
        """A message per tool call of a whole model reply, in order."""
        return [
            messages.tool_call(call, _call_envelope(call, display, acknowledge), on_error)
            for call in tool_calls.calls_of(reply)
        ]

    # -- the screen and input ---------------------------------------------------------------------------

    @staticmethod
    def screenshot(format: str, options: ShotOptions) -> Message[bytes]:
        return Message({"action": {"type": "screenshot", "format": format, **options}}, _image)

    @staticmethod
    def zoom(x: int, y: int, width: int, height: int, options: ZoomOptions) -> Message[bytes]:
        region = {"x": x, "y": y, "width": width, "height": height}
        return Message({"action": {"type": "zoom", "region": region, **options}}, _image)

    @staticmethod
    def click(
        x: int | None, y: int | None, button: str, count: int, modifiers: Sequence[str], envelope: Envelope
    ) -> Message[r.Position]:
        at = {"x": x, "y": y} if x is not None and y is not None else {}
        action = {"type": "click", "button": button, "count": count, "modifiers": list(modifiers), **at}
        return _of(r.Position, action, envelope)

    @staticmethod
    def pointer(kind: str, envelope: Envelope | None = None, **fields: object) -> Message[r.Position]:
        """``mouse_down``, ``mouse_up``, ``move``: where the pointer is after."""
        return _of(r.Position, {"type": kind, **fields}, envelope)

    @staticmethod
    def scroll(
        x: int | None,
        y: int | None,
        direction: str | None,
        clicks: int | None,
        dx: int | None,
        dy: int | None,
        envelope: Envelope,
    ) -> Message[r.ScrolledClicks | r.ScrolledPixels]:
        action = {"type": "scroll", **_given(x=x, y=y, direction=direction, clicks=clicks, dx=dx, dy=dy)}
        return Message(message(action, envelope), _then(r.Scrolled, lambda scrolled: scrolled.root))

    @staticmethod
    def drag(path: Sequence[tuple[int, int]], envelope: Envelope) -> Message[r.Position]:
        return _of(r.Position, {"type": "drag", "path": [{"x": x, "y": y} for x, y in path]}, envelope)

    @staticmethod
    def type(text: str, envelope: Envelope) -> Message[r.Typed]:
        return _of(r.Typed, {"type": "type", "text": text}, envelope)

    @staticmethod
    def key(keys: str, hold_ms: int | None, envelope: Envelope) -> Message[r.Done]:
        return _of(r.Done, {"type": "key", "keys": keys, **_given(hold_ms=hold_ms)}, envelope)

    @staticmethod
    def wait(ms: int, envelope: Envelope | None = None) -> Message[r.Done]:
        return _of(r.Done, {"type": "wait", "ms": ms}, envelope)

    @staticmethod
    def cursor_position() -> Message[tuple[int, int]]:
        return Message({"action": {"type": "cursor_position"}}, _then(r.Position, lambda at: (at.x, at.y)))

    @staticmethod
    def clipboard_get() -> Message[str]:
        return Message({"action": {"type": "clipboard_get"}}, _then(r.ClipboardText, lambda got: got.text))

    @staticmethod
    def clipboard_set(text: str) -> Message[None]:
        return Message({"action": {"type": "clipboard_set", "text": text}}, _then(r.Done, lambda _: None))

    # -- the browser ------------------------------------------------------------------------------------

    @staticmethod
    def navigate(url: str, options: PageOptions, envelope: Envelope | None = None) -> Message[r.Navigated]:
        return _of(r.Navigated, {"type": "navigate", "url": url, **options}, envelope)

    @staticmethod
    def page(kind: Literal["back", "forward", "reload", "page_info"]) -> Message[r.PageShown]:
        return _of(r.PageShown, {"type": kind})

    @staticmethod
    def tabs() -> Message[list[r.Tab]]:
        return Message({"action": {"type": "tabs"}}, _then(r.TabList, lambda listed: listed.tabs))

    @staticmethod
    def tab_new(url: str | None) -> Message[r.TabShown]:
        return _of(r.TabShown, {"type": "tab_new", "url": url})

    @staticmethod
    def tab_switch(tab: str | int) -> Message[r.TabShown]:
        return _of(r.TabShown, {"type": "tab_switch", "tab": tab})

    @staticmethod
    def tab_close(tab: str | int | None) -> Message[r.TabClosed]:
        return _of(r.TabClosed, {"type": "tab_close", "tab": tab})

    # -- the control lease ------------------------------------------------------------------------------

    @staticmethod
    def control(wait_ms: int) -> Message[r.LeaseAnswer]:
        return _of(r.LeaseAnswer, {"type": "control", "wait_ms": wait_ms})

    @staticmethod
    def request_control(reason: str, wait_ms: int | None) -> Message[r.LeaseAnswer]:
        return _of(r.LeaseAnswer, _given(type="request_control", reason=reason, wait_ms=wait_ms))

    # -- commands, processes, files ---------------------------------------------------------------------

    @staticmethod
    def exec(action: commands.ExecAction) -> Message[ExecResult]:
        return Message({"action": action}, exec_result)

    @staticmethod
    def start(action: commands.ExecAction) -> Message[int]:
        return Message({"action": {**action, "background": True}}, _then(r.ExecStarted, lambda started: started.pid))

    @staticmethod
    def process_list() -> Message[list[r.ProcessInfo]]:
        return Message({"action": {"type": "process_list"}}, _then(r.ProcessListing, lambda listed: listed.processes))

    @staticmethod
    def process_wait(pid: int, timeout_ms: int | None) -> Message[ExecResult]:
        return Message({"action": {"type": "process_wait", "pid": pid, **_given(timeout_ms=timeout_ms)}}, exec_result)

    @staticmethod
    def process_kill(pid: int, signal: str | int) -> Message[r.Signalled]:
        return _of(r.Signalled, {"type": "process_kill", "pid": pid, "signal": signal})

    @staticmethod
    def process_write(pid: int, data: str | bytes, eof: bool) -> Message[int]:
        return Message(
            {"action": commands.process_write_action(pid, data, eof)}, _then(r.StdinWritten, lambda w: w.written)
        )

    @staticmethod
    def process_output(
        pid: int, stream: str, offset: int, max_bytes: int | None, output_encoding: str | None
    ) -> Message[r.ProcessOutputSlice]:
        options = _given(max_bytes=max_bytes, output_encoding=output_encoding)
        return _of(
            r.ProcessOutputSlice, {"type": "process_output", "pid": pid, "stream": stream, "offset": offset, **options}
        )

    @staticmethod
    def process_resize(pid: int, rows: int, cols: int) -> Message[r.Resized]:
        return _of(r.Resized, {"type": "process_resize", "pid": pid, "rows": rows, "cols": cols})

    @staticmethod
    def file_read(path: str, offset: int, length: int | None) -> Message[bytes]:
        action = {"type": "file_read", "path": path, "offset": offset, "encoding": "base64", **_given(length=length)}
        return Message(
            {"action": action}, _then(r.FileContent, lambda read: commands.decode(read.content, read.encoding))
        )

    @staticmethod
    def file_read_text(path: str, offset: int, length: int | None) -> Message[str]:
        """A file read as UTF-8 text: its bytes, decoded here (not by the sandbox, which would cut a
        window at a character's edge), strictly; anything that is not UTF-8 is a :class:`CorralError`."""
        raw = messages.file_read(path, offset, length)
        return Message(raw.body, lambda reply: utf8_text(path, raw.read(reply)))

    @staticmethod
    def file_write(
        path: str, content: str | bytes, append: bool, mode: int | str | None, make_dirs: bool
    ) -> Message[r.FileWritten]:
        return _of(r.FileWritten, commands.file_write_action(path, content, append, mode, make_dirs))

    @staticmethod
    def file_list(path: str, recursive: bool, pattern: str | None, limit: int | None) -> Message[r.FileListing]:
        options = _given(pattern=pattern, limit=limit)
        return _of(r.FileListing, {"type": "file_list", "path": path, "recursive": recursive, **options})

    @staticmethod
    def file_stat(path: str) -> Message[r.FileEntry]:
        return _of(r.FileEntry, {"type": "file_stat", "path": path})

    @staticmethod
    def file_remove(path: str, recursive: bool) -> Message[r.FileRemoved]:
        return _of(r.FileRemoved, {"type": "file_remove", "path": path, "recursive": recursive})

    @staticmethod
    def file_move(source: str, destination: str, overwrite: bool) -> Message[r.FileMoved]:
        action = {"type": "file_move", "source": source, "destination": destination, "overwrite": overwrite}
        return _of(r.FileMoved, action)

    # -- the code interpreter ------------------------------------------------------------------------

    @staticmethod
    def run_code(code: str, language: str, context: str, timeout_ms: int | None, stream: bool) -> Message[Execution]:
        """One cell; ``stream``: its output and results come as event frames before the reply
        (:func:`code_event`)."""
        options = _given(timeout_ms=timeout_ms, stream=stream or None)
        action = {"type": "run_code", "code": code, "language": language, "context": context, **options}
        return Message({"action": action}, _then(r.CodeExecution, Execution.of))

    @staticmethod
    def list_code_contexts() -> Message[list[r.CodeContextInfo]]:
        return Message(
            {"action": {"type": "list_code_contexts"}}, _then(r.CodeContextListing, lambda listed: listed.contexts)
        )

    @staticmethod
    def restart_code_context(context: str) -> Message[r.CodeContextInfo]:
        return _of(r.CodeContextInfo, {"type": "restart_code_context", "context": context})

    @staticmethod
    def remove_code_context(context: str) -> Message[r.CodeContextRemoved]:
        return _of(r.CodeContextRemoved, {"type": "remove_code_context", "context": context})
