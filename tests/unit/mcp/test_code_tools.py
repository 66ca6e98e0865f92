"""``run_code`` and ``restart_code_context`` through the in-memory MCP client over a fake gateway: the
action each sends, printed logs and text results as text, a chart as image content, a cell's
exception as a tool error with its traceback, a refusal as Corral's coded tool error."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
from mcp_types import ImageContent, TextContent
from PIL import Image

from .conftest import FakeGateway, call, connect, reply

S = "ses_1"


def _png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _run(**fields: Any) -> dict[str, Any]:
    run = {
        "context": "default",
        "language": "python",
        "results": [],
        "logs": {"stdout": [], "stderr": [], "truncated": False},
        "error": None,
        "execution_count": 2,
        "timed_out": False,
        "state_lost": False,
        "duration_ms": 9.0,
    }
    return {**run, **fields}


async def test_run_code_answers_logs_text_and_a_chart_as_image_content(fake: FakeGateway) -> None:
    png = _png()
    chart = {"data": {"image/png": png, "text/plain": "<Figure size 640x480>"}, "is_main_result": False}
    table = {"data": {"text/plain": "   a\n0  1", "text/html": "<table>...</table>"}, "is_main_result": True}
    logs = {"stdout": ["rows: 1\n"], "stderr": [], "truncated": False}
    fake.answer = lambda request: reply(_run(results=[chart, table], logs=logs))
    async with connect(fake) as client:
        answered = await call(client, "run_code", session_id=S, code="df", context="data", timeout_ms=5000)
    assert not answered.is_error
    head, image, text = answered.content
    assert isinstance(head, TextContent) and "--- stdout ---\nrows: 1\n" in head.text and "execution 2" in head.text
    assert isinstance(image, ImageContent) and image.mime_type == "image/png" and image.data == png
    assert Image.open(io.BytesIO(base64.b64decode(image.data))).size == (40, 30)
    assert isinstance(text, TextContent) and text.text == "   a\n0  1"
    structured = answered.structured_content or {}
    assert structured["execution_count"] == 2
    assert structured["results"][0]["data"]["image/png"].endswith("bytes: the image content>")  # not twice
    assert fake.bodies() == [
        {"action": {"type": "run_code", "code": "df", "language": "python", "context": "data", "timeout_ms": 5000}}
    ]
    assert fake.sent[0].url.path == f"/v1/sessions/{S}/actions"


async def test_an_exception_is_a_tool_error_with_its_traceback(fake: FakeGateway) -> None:
    error = {"name": "NameError", "value": "name 'y' is not defined", "traceback": "Traceback ...\nNameError: y"}
    fake.answer = lambda request: reply(_run(error=error, state_lost=True))
    async with connect(fake) as client:
        answered = await call(client, "run_code", session_id=S, code="y")
    assert answered.is_error
    texts = [block.text for block in answered.content if isinstance(block, TextContent)]
    assert texts[-1] == "Traceback ...\nNameError: y" and "variables are gone" in texts[0]
    assert (answered.structured_content or {})["error"]["name"] == "NameError"


async def test_a_refused_cell_and_a_bad_context_are_coded_tool_errors(fake: FakeGateway) -> None:
    refused = {"code": "code_unavailable", "message": "no kernel in this image"}
    fake.answer = lambda request: httpx.Response(200, json={"ok": False, "id": None, "error": refused})
    async with connect(fake) as client:
        answered = await call(client, "run_code", session_id=S, code="1")
        assert answered.is_error and (answered.structured_content or {})["error"]["code"] == "code_unavailable"
        bad = await call(client, "run_code", session_id=S, code="1", context="no spaces")
    assert bad.is_error and len(fake.sent) == 1  # refused by the tool's schema, never sent


async def test_restart_code_context(fake: FakeGateway) -> None:
    info = {"name": "data", "language": "python", "state": "idle", "pid": 50, "execution_count": 0, "started": 2.0}
    fake.answer = lambda request: reply(info)
    async with connect(fake) as client:
        answered = await call(client, "restart_code_context", session_id=S, context="data")
    assert not answered.is_error and (answered.structured_content or {})["pid"] == 50
    assert fake.bodies() == [{"action": {"type": "restart_code_context", "context": "data"}}]
