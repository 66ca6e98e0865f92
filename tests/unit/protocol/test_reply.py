"""Success and failure replies for each dialect."""

from __future__ import annotations

import base64
import json

import pytest

from corral.errors import ActionError, ErrorCode
from corral.protocol import EncodedImage, reply
from corral.protocol.plan import RequestId

from .conftest import PlanFn
from .wired import result_of

PNG = EncodedImage("image/png", b"\x89PNG\r\n\x1a\nfake", 1280, 800)
SETTLED = EncodedImage("image/jpeg", b"\xff\xd8\xffjpeg", 640, 400, settle_ms=87.6543, settled=True)
UNSETTLED = EncodedImage("image/webp", b"RIFFwebp", 100, 50, settle_ms=3000.0, settled=False)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_native_success_without_image(plan: PlanFn) -> None:
    p = plan({"id": "n1", "action": {"type": "page_info"}})
    out = reply.success(p, [result_of({"url": "about:blank", "title": ""})], None, 12.3456)
    assert out == {"id": "n1", "ok": True, "result": {"url": "about:blank", "title": ""}, "elapsed_ms": 12.35}


def test_native_success_with_image_carries_the_data(plan: PlanFn) -> None:
    p = plan({"id": 7, "action": {"type": "click", "x": 1, "y": 1}, "screenshot": True})
    out = reply.success(p, [result_of({})], PNG, 1.0)
    assert out["id"] == 7
    assert out["ok"] is True
    assert out["result"] == {}
    assert out["screenshot"] == {"media_type": "image/png", "width": 1280, "height": 800, "data": b64(PNG.data)}
    assert out["elapsed_ms"] == 1.0


def test_the_last_step_result_is_reported(plan: PlanFn) -> None:
    p = plan({"openai": [{"type": "wait", "ms": 0}, {"type": "wait", "ms": 0}]})
    q = plan({"action": {"type": "wait"}})
    assert reply.success(q, [result_of({"first": 1}), result_of({"last": 2})], None, 0)["result"] == {"last": 2}
    assert reply.success(p, [result_of({}), result_of({})], None, 0)["result"] == {}


@pytest.mark.parametrize(
    ("image", "settle"),
    [(SETTLED, {"settle_ms": 87.7, "settled": True}), (UNSETTLED, {"settle_ms": 3000.0, "settled": False}), (PNG, {})],
)
def test_image_block_settle_fields(plan: PlanFn, image: EncodedImage, settle: dict[str, object]) -> None:
    p = plan({"action": {"type": "wait"}, "screenshot": True, "wait_for": "stable"})
    block = reply.success(p, [result_of({})], image, 0)["screenshot"]
    assert block == {
        "media_type": image.media_type,
        "width": image.width,
        "height": image.height,
        "data": b64(image.data),
        **settle,
    }


def test_anthropic_success_puts_the_image_in_the_tool_result_only(plan: PlanFn) -> None:
    p = plan({"id": "a1", "anthropic": {"action": "left_click", "coordinate": [5, 5]}})
    out = reply.success(p, [result_of({})], SETTLED, 250.0)
    assert out["result"] == {
        "tool_result_content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(SETTLED.data)}},
        ]
    }
    # The top-level block describes the image but does not repeat its bytes.
    assert out["screenshot"] == {
        "media_type": "image/jpeg",
        "width": 640,
        "height": 400,
        "settle_ms": 87.7,
        "settled": True,
    }
    assert out["elapsed_ms"] == 250.0


def test_anthropic_cursor_position(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "cursor_position"}})
    out = reply.success(p, [result_of({"x": 100, "y": 200})], None, 0.5)
    assert out["result"] == {"tool_result_content": [{"type": "text", "text": "X=100,Y=200"}]}
    assert "screenshot" not in out


def test_anthropic_cursor_position_is_scaled_back_to_the_display(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "cursor_position"}, "display": {"width": 1024, "height": 640}})
    out = reply.success(p, [result_of({"x": 1280 // 2, "y": 800 // 2})], None, 0)
    assert out["result"]["tool_result_content"] == [{"type": "text", "text": "X=512,Y=320"}]


def test_anthropic_without_image_has_empty_content(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "key", "text": "Return"}, "screenshot": False})
    out = reply.success(p, [result_of({})], None, 0)
    assert out["result"] == {"tool_result_content": []}
    assert "screenshot" not in out


def test_openai_success(plan: PlanFn) -> None:
    p = plan({"id": "o1", "openai": {"type": "click", "x": 1, "y": 1}})
    out = reply.success(p, [result_of({})], PNG, 3.14159)
    assert out["result"] == {
        "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{b64(PNG.data)}"}
    }
    assert out["screenshot"] == {"media_type": "image/png", "width": 1280, "height": 800}
    assert out["elapsed_ms"] == 3.14


def test_openai_without_image(plan: PlanFn) -> None:
    p = plan({"openai": {"type": "wait"}, "screenshot": False})
    out = reply.success(p, [result_of({})], None, 0)
    assert out["result"] == {}
    assert "screenshot" not in out


def test_a_shell_calls_asked_screenshot_rides_with_its_data(plan: PlanFn) -> None:
    # A shell_call_output cannot hold an image, so the reply's screenshot carries it, as a native one does.
    call = {"type": "shell_call", "id": "sh_1", "call_id": "call_1", "status": "completed"}
    p = plan({"openai": {**call, "action": {"commands": ["true"]}}, "screenshot": True})
    ran = result_of({"exit_code": 0, "signal": None, "stdout": "", "stderr": "", "timed_out": False})
    out = reply.success(p, [ran], PNG, 1.0)
    assert out["result"]["item"]["type"] == "shell_call_output"
    assert out["screenshot"]["data"] == b64(PNG.data)


def test_an_anthropic_tool_results_screenshot_is_only_in_the_block(plan: PlanFn) -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "true"}}
    p = plan({"anthropic": block, "screenshot": True})
    out = reply.success(p, [result_of({"output": "", "exit_code": 0, "truncated": False})], PNG, 1.0)
    assert out["result"]["tool_result"]["content"][-1]["source"]["data"] == b64(PNG.data)
    assert "data" not in out["screenshot"]


def test_replies_are_json_serialisable(plan: PlanFn) -> None:
    p = plan({"anthropic": {"action": "screenshot"}})
    out = reply.success(p, [result_of({})], SETTLED, 0)
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize(
    ("request_id", "error", "expected"),
    [
        (
            "r1",
            ActionError(ErrorCode.OUT_OF_BOUNDS, "off", field="action.x"),
            {"id": "r1", "ok": False, "error": {"code": "out_of_bounds", "message": "off", "field": "action.x"}},
        ),
        (
            3,
            ActionError(ErrorCode.INVALID_JSON, "bad json"),
            {"id": 3, "ok": False, "error": {"code": "invalid_json", "message": "bad json"}},
        ),
        (
            None,
            ActionError(ErrorCode.TIMEOUT, "took too long"),
            {"id": None, "ok": False, "error": {"code": "timeout", "message": "took too long"}},
        ),
    ],
)
def test_failure(request_id: str | int | None, error: ActionError, expected: dict[str, object]) -> None:
    assert reply.failure(request_id, error) == expected


def test_action_error_repr_and_str() -> None:
    err = ActionError(ErrorCode.UNKNOWN_KEY, "no such key", field="openai.keys[0]")
    assert str(err) == "no such key"
    assert repr(err) == "ActionError(unknown_key, 'no such key', field='openai.keys[0]')"


def test_error_codes_are_stable_strings() -> None:
    assert {str(c) for c in ErrorCode} >= {
        "invalid_json",
        "invalid_request",
        "message_too_large",
        "unknown_action",
        "missing_field",
        "unknown_field",
        "invalid_field",
        "out_of_bounds",
        "unknown_key",
        "text_too_long",
        "unsupported",
        "timeout",
        "internal",
    }
    assert all(str(c) == c.value for c in ErrorCode)


@pytest.mark.parametrize("request_id", [None, 7, "r-" + "x" * 500])
def test_encoded_replies_start_with_ok_whatever_the_id(request_id: RequestId) -> None:
    error = ActionError(ErrorCode.OUT_OF_BOUNDS, "x is off the screen", field="action.x")
    bad = reply.encode(reply.failure(request_id, error))
    good = reply.encode({"id": request_id, "result": {"text": '"ok":false'}, "ok": True})  # any key order
    assert bad.startswith('{"ok":false,') and good.startswith('{"ok":true,')
    assert json.loads(bad) == reply.failure(request_id, error)
    assert reply.failed(bad) and reply.failed(bad.encode()) and not reply.failed(good)
    assert reply.error_code(bad) == "out_of_bounds" and reply.error_code(good.encode()) is None
