"""A person's typed text never stays in a recorded event: its length and a mark instead."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.recording.redact import WITHHELD, is_character_keysym, redact, redact_human, typed_presses

PASSWORD = "c0rrect-h0rse-battery"


def _human(action: dict[str, Any], error: dict[str, Any] | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = (
        {"ok": True, "action_id": "h1.beef", "result": {"typed": 21, "via": "x"}}
        if error is None
        else {"ok": False, "action_id": "h1.beef", "error": error}
    )
    return {
        "action_id": "h1.beef",
        "dialect": "human",
        "actor": "human:lnk_abc",
        "request": {"action": dict(action)},
        "native": [dict(action)],
        "ok": error is None,
        "error": error,
        "reply": reply,
    }


def test_a_persons_type_keeps_its_length_and_the_mark_never_the_text() -> None:
    event = _human({"type": "type", "text": PASSWORD, "delay_ms": 0})
    out = redact(event)
    assert PASSWORD not in json.dumps(out)
    expected = {"type": "type", "delay_ms": 0, "redacted": True, "length": len(PASSWORD)}
    assert out["request"]["action"] == expected
    assert out["native"] == [expected]
    assert out["reply"]["result"] == {"typed": 21, "via": "x"}
    assert event["native"][0]["text"] == PASSWORD  # the event given is left as it was


@pytest.mark.parametrize(
    ("keys", "length"),
    [("a", 1), ("shift+a", 1), ("space", 1), ("7", 1), ("KP_5", 1), ("altgr+q", 1), ("p w Return", 2), ("é", 1)],
)
def test_a_key_that_types_a_character_is_typed_text_too(keys: str, length: int) -> None:
    out = redact(_human({"type": "key", "keys": keys, "repeat": 1}))
    assert out["native"] == [{"type": "key", "repeat": 1, "redacted": True, "length": length}]
    assert "keys" not in out["request"]["action"]


@pytest.mark.parametrize("keys", ["Return", "Tab", "ctrl+a", "ctrl+shift+t", "alt+F4", "super+a", "BackSpace", "Up"])
def test_chords_and_named_keys_that_type_nothing_stay(keys: str) -> None:
    event = _human({"type": "key", "keys": keys})
    assert redact(event) == event


def test_the_agents_own_typing_is_kept_as_it_is() -> None:
    event = {
        "action_id": "a1.beef",
        "dialect": "native",
        "actor": "agent",
        "request": {"id": 1, "action": {"type": "type", "text": PASSWORD}},
        "native": [{"type": "type", "text": PASSWORD}],
        "reply": {"ok": True, "result": {"typed": 21}},
    }
    assert redact(event) == event
    agent_key = {**event, "request": {"action": {"type": "key", "keys": "a"}}, "native": [{"type": "key", "keys": "a"}]}
    assert redact(agent_key) == agent_key


def test_an_error_that_quotes_the_text_is_withheld() -> None:
    error = {"code": "internal", "message": f"keyboard.insertText({PASSWORD!r}) failed"}
    out = redact(_human({"type": "type", "text": PASSWORD}, error=dict(error)))
    assert PASSWORD not in json.dumps(out)
    assert out["error"] == {"code": "internal", "message": WITHHELD}
    assert out["reply"]["error"] == {"code": "internal", "message": WITHHELD}


def test_redacting_twice_changes_nothing_more() -> None:
    once = redact(_human({"type": "type", "text": PASSWORD}))
    assert redact_human(once) is once
    assert redact(once) == once


def test_an_actor_named_human_is_redacted_whatever_its_dialect() -> None:
    event = {**_human({"type": "type", "text": PASSWORD}), "dialect": "native"}
    assert PASSWORD not in json.dumps(redact(event))


def test_an_unreadable_key_sequence_counts_as_typed() -> None:
    assert typed_presses("no_such_key_name") is None
    out = redact(_human({"type": "key", "keys": "no_such_key_name x"}))
    assert out["native"] == [{"type": "key", "redacted": True, "length": 2}]


def test_character_keysyms() -> None:
    assert is_character_keysym(ord("a")) and is_character_keysym(0x01000000 + 0x4E2D)  # a, 中
    assert not is_character_keysym(0xFF0D)  # Return
    assert not is_character_keysym(0xFFBE)  # F1
    assert not is_character_keysym(0x1008FF12)  # XF86AudioMute
