"""``corral run-code`` over a fake session WebSocket (``common.sandbox_client``): printed chunks as they
come, results as text, images to --save-images, a cell's error exit 1, a timeout 124; and ``corral
code contexts/restart/rm`` over the fake gateway."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import app, common

from .test_exec_cli import FakeSession


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[dict[str, Any]]], FakeSession]:
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")

    def install(frames: list[dict[str, Any]]) -> FakeSession:
        fake = FakeSession(frames)
        monkeypatch.setattr(common, "sandbox_client", fake)
        return fake

    return install


PNG_BYTES = b"\x89PNG\r\n\x1a\nchart-bytes"
CHART = {"data": {"image/png": base64.b64encode(PNG_BYTES).decode(), "text/plain": "<Figure>"}, "is_main_result": False}
VALUE = {"data": {"text/plain": "42"}, "is_main_result": True}


def _out(stream: str, text: str) -> dict[str, Any]:
    return {"id": 1, "event": "output", "stream": stream, "data": text, "encoding": "utf-8"}


def _reply(**fields: Any) -> dict[str, Any]:
    run = {
        "context": "default",
        "language": "python",
        "results": [],
        "logs": {"stdout": [], "stderr": [], "truncated": False},
        "error": None,
        "execution_count": 1,
        "timed_out": False,
        "state_lost": False,
        "duration_ms": 3.0,
    }
    return {"ok": True, "id": 1, "result": {**run, **fields}}


STREAMED = [
    _out("stdout", "loading\n"),
    {"id": 1, "event": "result", "result": CHART},
    _out("stderr", "a warning\n"),
    {"id": 1, "event": "result", "result": VALUE},
    # The reply repeats what was streamed: printed once.
    _reply(results=[CHART, VALUE], logs={"stdout": ["loading\n"], "stderr": ["a warning\n"], "truncated": False}),
]


def test_run_code_streams_output_prints_results_and_saves_images(session: Any, tmp_path: Path) -> None:
    fake: FakeSession = session(STREAMED)
    images = tmp_path / "shots"
    result = CliRunner().invoke(
        app, ["run-code", "ses_1", "x = 42\nx", "--context", "c1", "--timeout", "2.5", "--save-images", str(images)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "loading\n42\n"
    assert "a warning\n" in result.stderr and f"{images / 'result-1.png'}" in result.stderr
    assert (images / "result-1.png").read_bytes() == PNG_BYTES
    action = {"type": "run_code", "code": "x = 42\nx", "language": "python", "context": "c1", "timeout_ms": 2500}
    assert fake.sent == [{"action": {**action, "stream": True}}] and fake.opened == ["ses_1"]


def test_code_from_a_file_and_from_stdin(session: Any, tmp_path: Path) -> None:
    fake: FakeSession = session([_reply(results=[VALUE])])
    (tmp_path / "cell.py").write_text("print('from a file')")
    assert CliRunner().invoke(app, ["run-code", "ses_1", "--file", str(tmp_path / "cell.py")]).exit_code == 0
    result = CliRunner().invoke(app, ["run-code", "ses_1"], input="print('from stdin')")
    assert result.exit_code == 0 and result.stdout == "42\n"  # the reply's results, none streamed
    assert [sent["action"]["code"] for sent in fake.sent] == ["print('from a file')", "print('from stdin')"]
    both = CliRunner().invoke(app, ["run-code", "ses_1", "1", "--file", str(tmp_path / "cell.py")])
    assert both.exit_code == 2 and "not both" in both.stderr


def test_an_image_without_save_images_is_named_not_dumped(session: Any) -> None:
    session([{"id": 1, "event": "result", "result": CHART}, _reply()])
    result = CliRunner().invoke(app, ["run-code", "ses_1", "plot()"])
    assert result.exit_code == 0 and result.stdout == ""
    assert f"png image, {len(PNG_BYTES)} bytes: --save-images DIR writes it" in result.stderr


def test_a_cell_error_prints_its_traceback_and_exits_1(session: Any) -> None:
    error = {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback\nZeroDivisionError: x"}
    session([_out("stdout", "before\n"), _reply(error=error)])
    result = CliRunner().invoke(app, ["run-code", "ses_1", "1/0"])
    assert result.exit_code == 1
    assert result.stdout == "before\n" and "Traceback\nZeroDivisionError: x" in result.stderr


def test_a_timeout_exits_124_and_a_lost_state_is_said(session: Any) -> None:
    error = {"name": "Timeout", "value": "interrupted after 0.5 s", "traceback": ""}
    session([_reply(error=error, timed_out=True, state_lost=True)])
    result = CliRunner().invoke(app, ["run-code", "ses_1", "while True: pass", "--timeout", "0.5"])
    assert result.exit_code == 124
    assert "Timeout: interrupted after 0.5 s" in result.stderr and "timed out" in result.stderr
    assert "variables are gone" in result.stderr


def test_json_prints_the_whole_result_and_a_refusal_is_clean(session: Any, tmp_path: Path) -> None:
    reply = _reply(results=[CHART, VALUE])
    fake: FakeSession = session([reply])
    fake.request = lambda payload: (fake.sent.append(payload), reply)[1]  # type: ignore[attr-defined]
    result = CliRunner().invoke(app, ["run-code", "ses_1", "x", "--json", "--save-images", str(tmp_path)])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == reply["result"]
    assert "stream" not in fake.sent[0]["action"] and (tmp_path / "result-1.png").read_bytes() == PNG_BYTES
    refused = {"ok": False, "id": 1, "error": {"code": "invalid_field", "message": "bad context", "field": "context"}}
    session([refused])
    failed = CliRunner().invoke(app, ["run-code", "ses_1", "x", "--context", "no good"])
    assert failed.exit_code == 1 and "bad context" in failed.stderr


INFO = {"name": "default", "language": "python", "state": "idle", "pid": 77, "execution_count": 3, "started": 1.7e9}


def test_the_context_commands(gateway: Callable[[Any], list[httpx.Request]]) -> None:
    answers = {
        "list_code_contexts": {"contexts": [INFO]},
        "restart_code_context": INFO,
        "remove_code_context": {"name": "other", "removed": False},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        action = json.loads(request.content)["action"]
        return httpx.Response(200, json={"ok": True, "id": 1, "result": answers[action["type"]]})

    seen = gateway(handler)
    listed = CliRunner().invoke(app, ["code", "contexts", "ses_1"])
    assert listed.exit_code == 0 and "default" in listed.stdout and "77" in listed.stdout
    restarted = CliRunner().invoke(app, ["code", "restart", "ses_1"])
    assert restarted.exit_code == 0 and "restarted default (pid 77)" in restarted.stderr
    removed = CliRunner().invoke(app, ["code", "rm", "ses_1", "other"])
    assert removed.exit_code == 0 and "no context other was running" in removed.stderr
    assert [json.loads(r.content)["action"] for r in seen] == [
        {"type": "list_code_contexts"},
        {"type": "restart_code_context", "context": "default"},
        {"type": "remove_code_context", "context": "other"},
    ]
    assert {r.url.path for r in seen} == {"/v1/sessions/ses_1/actions"}


def test_an_svg_result_is_saved_as_svg_and_text_results_keep_their_order(session: Any, tmp_path: Path) -> None:
    svg = {"data": {"image/svg+xml": "<svg/>", "text/plain": "<Figure>"}, "is_main_result": False}
    markdown = {"data": {"text/markdown": "**bold**"}, "is_main_result": False}
    session([{"id": 1, "event": "result", "result": svg}, {"id": 1, "event": "result", "result": markdown}, _reply()])
    result = CliRunner().invoke(app, ["run-code", "ses_1", "show()", "--save-images", str(tmp_path)])
    assert result.exit_code == 0 and result.stdout == "**bold**\n"
    assert (tmp_path / "result-1.svg").read_text() == "<svg/>"
