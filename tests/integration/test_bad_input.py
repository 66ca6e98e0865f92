"""Every kind of bad input gets a structured error with a stable code; the connection keeps working."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from corral.client import SandboxClient
from corral.contracts import auth
from corral.runtime import SandboxAddress

BAD_FRAMES: list[tuple[str, str | bytes, str, str | None]] = [
    ("not json", "{oops", "invalid_json", None),
    ("json but not an object", "[1, 2, 3]", "invalid_request", None),
    ("binary garbage", b"\xff\xfe\x00garbage", "invalid_json", None),
    # Deeper than the parser's recursion: a 500 with a traceback before.
    ("nested 100000 deep", "[" * 100_000 + "]" * 100_000, "invalid_json", None),
    ("nested 40 deep in a field", '{"labels": ' + "[" * 40 + "]" * 40 + ', "id": 1}', "invalid_json", None),
    ("no payload", '{"id": 1}', "invalid_request", None),
    (
        "two payloads",
        '{"id": 1, "action": {"type": "screenshot"}, "openai": {"type": "screenshot"}}',
        "invalid_request",
        None,
    ),
    ("unknown envelope field", '{"id": 1, "action": {"type": "screenshot"}, "colour": 1}', "unknown_field", "colour"),
    ("unknown action", '{"id": 1, "action": {"type": "teleport"}}', "unknown_action", "action.type"),
    ("action without type", '{"id": 1, "action": {"x": 1}}', "missing_field", "action.type"),
    ("missing field", '{"id": 1, "action": {"type": "move", "x": 1}}', "missing_field", "action.y"),
    ("wrong type", '{"id": 1, "action": {"type": "move", "x": "left", "y": 1}}', "invalid_field", "action.x"),
    ("wrong enum", '{"id": 1, "action": {"type": "click", "button": "thumb"}}', "invalid_field", "action.button"),
    ("count out of range", '{"id": 1, "action": {"type": "click", "count": 7}}', "invalid_field", "action.count"),
    ("off the screen", '{"id": 1, "action": {"type": "click", "x": 1280, "y": 10}}', "out_of_bounds", "action.x"),
    ("negative coordinate", '{"id": 1, "action": {"type": "move", "x": -1, "y": 10}}', "out_of_bounds", "action.x"),
    (
        "drag point off screen",
        '{"id": 1, "action": {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 9, "y": 900}]}}',
        "out_of_bounds",
        "action.path[1]",
    ),
    (
        "region too big",
        '{"id": 1, "action": {"type": "screenshot", "region": {"x": 1000, "y": 0, "width": 400, "height": 10}}}',
        "out_of_bounds",
        "action.region",
    ),
    ("unknown key", '{"id": 1, "action": {"type": "key", "keys": "ctrl+banana"}}', "unknown_key", "action.keys"),
    (
        "modifier that is not one",
        '{"id": 1, "action": {"type": "click", "modifiers": ["a"]}}',
        "unknown_key",
        "action.modifiers",
    ),
    (
        "untypeable character",
        '{"id": 1, "action": {"type": "type", "text": "a\\u0007b"}}',
        "invalid_field",
        "action.text",
    ),
    (
        "text too long",
        json.dumps({"id": 1, "action": {"type": "type", "text": "x" * 20_001}}),
        "text_too_long",
        "action.text",
    ),
    (
        "message too large",
        json.dumps({"id": 1, "action": {"type": "clipboard_set", "text": "x" * (1 << 20)}}),
        "message_too_large",
        None,
    ),
    ("bad url", '{"id": 1, "action": {"type": "navigate", "url": "no scheme here"}}', "invalid_field", "action.url"),
    (
        "timeout above the cap",
        '{"id": 1, "action": {"type": "wait"}, "timeout_ms": 99999999}',
        "invalid_field",
        "timeout_ms",
    ),
    ("anthropic unknown action", '{"id": 1, "anthropic": {"action": "fly"}}', "invalid_field", "anthropic.action"),
    ("openai empty batch", '{"id": 1, "openai": []}', "invalid_request", "openai"),
]


@pytest.mark.parametrize(
    ("frame", "code", "field"), [case[1:] for case in BAD_FRAMES], ids=[case[0] for case in BAD_FRAMES]
)
def test_bad_input_gets_a_structured_error(
    client: SandboxClient, frame: str | bytes, code: str, field: str | None
) -> None:
    reply = client.send_raw(frame)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code, reply
    assert reply["error"].get("field") == field
    assert reply["error"]["message"]
    # The id is echoed whenever the message was read at all (an oversized one is not parsed).
    if isinstance(frame, str) and frame.startswith('{"id": 1') and code != "message_too_large":
        assert reply["id"] == 1
    # Nothing is lost: the same connection answers the next request.
    assert client.act({"type": "cursor_position"})["ok"] is True


def test_many_bad_messages_in_a_row_then_a_good_one(client: SandboxClient) -> None:
    for frame, *_ in [(case[1],) for case in BAD_FRAMES] * 3:
        assert client.send_raw(frame)["ok"] is False
    assert client.act({"type": "screenshot", "format": "jpeg"})["screenshot"]["width"] == 1280


def test_timeout_is_enforced_and_the_session_survives(client: SandboxClient) -> None:
    reply = client.request({"action": {"type": "wait", "ms": 5000}, "timeout_ms": 200})
    assert reply["ok"] is False and reply["error"]["code"] == "timeout"
    assert client.act({"type": "cursor_position"})["ok"] is True


def _post(sandbox: SandboxAddress, body: bytes) -> tuple[int, dict[str, Any]]:
    signed = auth.sign(sandbox.secret)
    headers = {"Content-Type": "application/json", **signed.headers}
    request = urllib.request.Request(f"{sandbox.base_url}/v1/actions", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_http_actions_endpoint(sandbox: SandboxAddress) -> None:
    status, reply = _post(sandbox, b'{"id": "h1", "action": {"type": "cursor_position"}}')
    assert status == 200 and reply["ok"] is True and reply["id"] == "h1"
    status, reply = _post(sandbox, b"{broken")
    assert status == 400 and reply["error"]["code"] == "invalid_json"
    status, reply = _post(sandbox, b'{"action": {"type": "wait", "ms": 2000}, "timeout_ms": 100}')
    assert status == 504 and reply["error"]["code"] == "timeout"
    status, reply = _post(sandbox, json.dumps({"action": {"type": "clipboard_set", "text": "x" * (1 << 20)}}).encode())
    assert status == 413 and reply["error"]["code"] == "message_too_large"
