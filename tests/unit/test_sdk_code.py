"""``sb.run_code`` and the code contexts without a gateway: the message each twin sends, the reply read
as E2B's ``Execution``, the streamed events heard by the callbacks in order, in both twins."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from corral.errors import ActionFailed, CorralError
from corral.protocol import results as r
from corral.sdk import AsyncSandbox, Execution, ExecutionError, OutputMessage, Result, Sandbox, messages
from corral.sdk.execution import Logs, with_streamed
from corral.sdk.messages import code_event

from .test_sdk import AsyncStreamRecorder, StreamRecorder, _async_sandbox, _sandbox

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nnot-a-real-chart").decode()
CHART = {"data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"}, "is_main_result": False}
VALUE = {"data": {"text/plain": "3", "application/json": '{"a": [1, 2]}'}, "is_main_result": True}


def _run(**overrides: Any) -> dict[str, Any]:
    run = {
        "context": "default",
        "language": "python",
        "results": [CHART, VALUE],
        "logs": {"stdout": ["hi\n"], "stderr": ["warn\n"], "truncated": False},
        "error": None,
        "execution_count": 4,
        "timed_out": False,
        "state_lost": False,
        "duration_ms": 12.5,
    }
    return {**run, **overrides}


def _reply(result: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "id": 1, "result": result}


async def test_run_code_sends_one_action_and_reads_an_execution_in_both_twins() -> None:
    sandbox, ws = _sandbox(_reply(_run()))
    twin, twin_ws = _async_sandbox(_reply(_run()))
    got = sandbox.run_code("x = 1\nx + 2", context="ctx-1", timeout_ms=500)
    assert got == await twin.run_code("x = 1\nx + 2", context="ctx-1", timeout_ms=500)
    action = {"type": "run_code", "code": "x = 1\nx + 2", "language": "python", "context": "ctx-1", "timeout_ms": 500}
    assert ws.sent == twin_ws.sent == [{"action": action}]  # no stream without a callback
    assert isinstance(got, Execution)
    assert got.text == "3" and got.execution_count == 4 and got.error is None and got.duration_ms == 12.5
    assert got.logs.stdout == ["hi\n"] and got.logs.stderr == ["warn\n"]
    chart, value = got.results
    assert chart.formats() == ["text", "png"] and not chart.is_main_result
    assert chart.png == PNG and chart.html is None and chart.json is None
    assert chart.image_bytes() == ("png", b"\x89PNG\r\n\x1a\nnot-a-real-chart")
    assert value.json == {"a": [1, 2]} and value.is_main_result and value.image_bytes() is None
    assert repr(value) == "Result(3)" and "png" in repr(Result({"image/png": PNG}))


def test_the_action_is_one_the_protocol_accepts() -> None:
    from corral.protocol.actions import RunCode

    body = messages.run_code("print(1)", "python", "default", None, True).body
    RunCode.model_validate(body["action"])  # the shape the sandbox validates
    assert body["action"]["stream"] is True


def test_an_error_cell_is_a_result_and_a_refused_one_raises() -> None:
    error = {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback...\nZeroDivisionError"}
    sandbox, _ = _sandbox(_reply(_run(results=[], error=error, timed_out=False)))
    got = sandbox.run_code("1/0")
    assert got.error == ExecutionError("ZeroDivisionError", "division by zero", "Traceback...\nZeroDivisionError")
    assert got.text is None
    assert json.loads(got.to_json())["error"]["name"] == "ZeroDivisionError"
    refused = {"ok": False, "id": 1, "error": {"code": "invalid_field", "message": "context: bad", "field": "context"}}
    sandbox, _ = _sandbox(refused)
    with pytest.raises(ActionFailed) as failed:
        sandbox.run_code("1", context="no spaces")
    assert failed.value.code == "invalid_field"


def test_a_reply_this_client_cannot_read_is_a_clear_error() -> None:
    sandbox, _ = _sandbox(_reply({"context": "default"}))
    with pytest.raises(CorralError, match="no CodeExecution"):
        sandbox.run_code("1")


def test_json_that_is_not_json_and_an_image_that_is_not_base64_are_clear_errors() -> None:
    with pytest.raises(CorralError, match="application/json"):
        _ = Result({"application/json": "{nope"}).json
    with pytest.raises(CorralError, match="base64"):
        Result({"image/png": "***"}).image_bytes()
    assert Result({"image/svg+xml": "<svg/>"}).image_bytes() == ("svg", b"<svg/>")


STREAMED = [
    {"id": 1, "event": "output", "stream": "stdout", "data": "step 1\n", "encoding": "utf-8"},
    {"id": 1, "event": "result", "result": CHART},
    {"id": 1, "event": "output", "stream": "stderr", "data": "warn\n", "encoding": "utf-8"},
    {"id": 1, "event": "result", "result": VALUE},
]


def _heard() -> tuple[list[tuple[str, object]], dict[str, Any]]:
    heard: list[tuple[str, object]] = []
    callbacks = {
        "on_stdout": lambda m: heard.append(("stdout", m.line)),
        "on_stderr": lambda m: heard.append(("stderr", m.line)),
        "on_result": lambda res: heard.append(("result", res.formats())),
        "on_error": lambda e: heard.append(("error", e.name)),
    }
    return heard, callbacks


ORDER = [("stdout", "step 1\n"), ("result", ["text", "png"]), ("stderr", "warn\n"), ("result", ["text", "json"])]


async def test_callbacks_stream_the_events_in_order_in_both_twins() -> None:
    error = {"name": "ValueError", "value": "late", "traceback": "tb"}
    frames = [*STREAMED, _reply(_run(error=error))]
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox._ws, twin._ws = StreamRecorder(frames), AsyncStreamRecorder(frames)  # type: ignore[assignment]
    heard, callbacks = _heard()
    got = sandbox.run_code("make()", **callbacks)
    assert heard == [*ORDER, ("error", "ValueError")]
    async_heard: list[tuple[str, object]] = []

    async def on_result(result: Result) -> None:  # an async twin's callback may be a coroutine function
        async_heard.append(("result", result.formats()))

    async_got = await twin.run_code(
        "make()",
        on_stdout=lambda m: async_heard.append(("stdout", m.line)),
        on_stderr=lambda m: async_heard.append(("stderr", m.line)),
        on_result=on_result,
    )
    assert async_heard == ORDER and got == async_got and got.error is not None
    action = {"type": "run_code", "code": "make()", "language": "python", "context": "default", "stream": True}
    sent = {"action": action}
    assert sandbox._ws.sent == twin._ws.sent == [sent]  # type: ignore[attr-defined]


def test_what_the_reply_left_out_of_a_streamed_cell_comes_from_its_events() -> None:
    frames = [*STREAMED, _reply(_run(results=[], logs={"stdout": [], "stderr": [], "truncated": False}))]
    sandbox = Sandbox.__new__(Sandbox)
    sandbox._ws = StreamRecorder(frames)  # type: ignore[assignment]
    got = sandbox.run_code("make()", on_stdout=lambda _: None)
    assert got.logs == Logs(["step 1\n"], ["warn\n"]) and got.text == "3" and len(got.results) == 2
    # A reply that holds them keeps its own (the events are not counted twice).
    kept = with_streamed(Execution.of(r.CodeExecution.model_validate(_run())), [OutputMessage("x", 0)])
    assert kept.logs.stdout == ["hi\n"]


def test_a_base64_chunk_is_decoded_for_the_callback() -> None:
    event = {"id": 1, "event": "output", "stream": "stdout", "data": base64.b64encode(b"caf\xc3\xa9").decode()}
    heard = code_event({**event, "encoding": "base64"})
    assert isinstance(heard, OutputMessage) and heard.line == "café" and not heard.error


async def test_the_contexts_in_both_twins() -> None:
    info = {"name": "default", "language": "python", "state": "idle", "pid": 41, "execution_count": 2, "started": 1.0}
    sandbox, ws = _sandbox(_reply({"contexts": [info]}))
    twin, twin_ws = _async_sandbox(_reply({"contexts": [info]}))
    assert sandbox.list_code_contexts() == await twin.list_code_contexts() == [r.CodeContextInfo.model_validate(info)]
    sandbox, ws = _sandbox(_reply(info))
    assert sandbox.restart_code_context("default").pid == 41
    assert ws.sent == [{"action": {"type": "restart_code_context", "context": "default"}}]
    twin, twin_ws = _async_sandbox(_reply({"name": "other", "removed": False}))
    assert await twin.remove_code_context("other") == r.CodeContextRemoved(name="other", removed=False)
    assert twin_ws.sent == [{"action": {"type": "remove_code_context", "context": "other"}}]


async def test_a_refused_streamed_cell_raises_in_both_twins_after_no_callback() -> None:
    refused = {"ok": False, "id": 1, "error": {"code": "code_context_limit", "message": "8 contexts", "field": "x"}}
    sandbox, twin = Sandbox.__new__(Sandbox), AsyncSandbox.__new__(AsyncSandbox)
    sandbox._ws, twin._ws = StreamRecorder([refused]), AsyncStreamRecorder([refused])  # type: ignore[assignment]
    heard: list[object] = []
    with pytest.raises(ActionFailed) as failed:
        sandbox.run_code("1", context="ninth", on_error=heard.append)
    with pytest.raises(ActionFailed) as async_failed:
        await twin.run_code("1", context="ninth", on_error=heard.append)
    assert failed.value.code == async_failed.value.code == "code_context_limit" and heard == []


def test_to_json_names_formats_as_e2b_does() -> None:
    got = Execution.of(r.CodeExecution.model_validate(_run()))
    encoded = json.loads(got.to_json())
    assert encoded["results"][0] == {"text": CHART["data"]["text/plain"], "png": PNG}
    assert encoded["results"][1] == {"text": "3", "json": {"a": [1, 2]}}  # parsed, as E2B's
    assert encoded["logs"] == {"stdout": ["hi\n"], "stderr": ["warn\n"]} and encoded["error"] is None
