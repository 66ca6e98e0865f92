"""Judging a replay, step by step, through a fake sandbox (the ``send`` seam replay() takes)."""

from __future__ import annotations

import base64
import io
import xml.etree.ElementTree as ET
from typing import Any

from PIL import Image

from corral.recording.bundle import Bundle
from corral.recording.replay import (
    FRAME_REQUEST,
    ReplayOptions,
    ReplayReport,
    StepVerdict,
    html_report,
    junit_xml,
    replay,
)


def webp(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 40), color).save(out, "WEBP")
    return out.getvalue()


WHITE, BLACK = webp((255, 255, 255)), webp((0, 0, 0))


def action(seq: int, frame: bytes | None, ok: bool = True, code: str | None = None, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "seq": seq,
        "event": "action",
        "request": {"id": str(seq), "action": {"type": "wait", "ms": 0}},
        "native": [{"type": "wait", "ms": 0}],
        "ok": ok,
        "frame": f"frames/{seq:06d}.webp" if frame is not None else None,
        **extra,
    }
    if code is not None:
        event["error"] = {"code": code, "message": "no"}
    return event


def bundle(events: list[dict[str, Any]], frames: dict[int, bytes]) -> Bundle:
    return Bundle(
        "test",
        {"viewport": {"width": 64, "height": 40}},
        events,
        {f"frames/{seq:06d}.webp": data for seq, data in frames.items()},
    )


class Sandbox:
    """Answers each request as told; screenshots from a list of frames (None: the screenshot fails)."""

    def __init__(self, replies: list[dict[str, Any]], screens: list[bytes | None]) -> None:
        self.replies, self.screens = list(replies), list(screens)

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if request is FRAME_REQUEST:
            screen = self.screens.pop(0)
            if screen is None:
                return {"ok": False, "error": {"code": "screenshot_failed"}}
            return {"ok": True, "screenshot": {"data": base64.b64encode(screen).decode()}}
        return self.replies.pop(0)


OK = {"ok": True}


def test_identical_frames_pass_and_a_changed_one_diverges() -> None:
    recorded = bundle([action(1, WHITE), action(2, WHITE)], {1: WHITE, 2: WHITE})
    report = replay(recorded, Sandbox([OK, OK], [WHITE, BLACK]), ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged"]
    assert not report.passed and [s.number for s in report.divergences] == [2]


def test_a_step_without_a_frame_is_skipped_with_its_reason_not_passed() -> None:
    recorded = bundle([action(1, None), action(2, WHITE)], {2: WHITE})
    report = replay(recorded, Sandbox([OK, OK], [WHITE, None]), ReplayOptions())
    assert [s.status for s in report.steps] == ["skipped", "skipped"]
    assert "the recording has no frame" in report.steps[0].reason
    assert "screenshot failed" in report.steps[1].reason
    assert report.passed  # nothing diverged
    suite = ET.fromstring(junit_xml(report))
    assert suite.get("skipped") == "2" and suite.get("failures") == "0"
    messages = [case.find("skipped").get("message") for case in suite.iter("testcase")]  # type: ignore[union-attr]
    assert messages[0].startswith("no frame to compare")  # type: ignore[union-attr]
    assert "2 skipped" in html_report(report)


def test_failing_requests_are_compared_by_their_error_code() -> None:
    recorded = bundle(
        [action(1, WHITE, ok=False, code="out_of_bounds"), action(2, WHITE, ok=False, code="timeout")],
        {1: WHITE, 2: WHITE},
    )
    replies = [{"ok": False, "error": {"code": "out_of_bounds"}}, {"ok": False, "error": {"code": "invalid_field"}}]
    report = replay(recorded, Sandbox(replies, [WHITE, WHITE]), ReplayOptions())
    assert [s.status for s in report.steps] == ["passed", "diverged"]
    assert report.steps[1].reason == "the request failed with invalid_field, recorded timeout"


def test_an_unsettled_recorded_frame_is_named_in_the_verdict() -> None:
    recorded = bundle([action(1, WHITE, frame_settled=False)], {1: WHITE})
    report = replay(recorded, Sandbox([OK], [BLACK]), ReplayOptions())
    assert report.steps[0].status == "diverged"
    assert "before the screen settled" in report.steps[0].reason and "re-record" in report.steps[0].reason


def test_lost_events_are_warned_about_in_every_report() -> None:
    events = [
        action(1, WHITE),
        {"seq": 2, "event": "gap", "lost": 3},
        {"seq": 3, "event": "controller_restarted"},
        action(4, WHITE),
    ]
    logged: list[str] = []
    report = replay(
        bundle(events, {1: WHITE, 4: WHITE}), Sandbox([OK, OK], [WHITE, WHITE]), ReplayOptions(), logged.append
    )
    assert report.passed and len(report.warnings) == 2
    assert "lost 3 event(s)" in report.warnings[0] and "restarted" in report.warnings[1]
    assert logged[:2] == [f"warning: {w}" for w in report.warnings]
    suite = ET.fromstring(junit_xml(report))
    assert [p.get("value") for p in suite.iter("property")] == report.warnings
    assert "lost 3 event(s)" in (suite.findtext("system-out") or "")
    page = html_report(report)
    assert "id=warnings" in page and "lost 3 event(s)" in page


def test_junit_survives_control_characters_in_typed_text() -> None:
    step = StepVerdict(1, "type text=a\x08\x00b", True, True, 0.01, 0.5, "diverged", "differs \x1b")
    suite = ET.fromstring(junit_xml(ReplayReport("bundle\x07", [step])))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("1", "1", "0")
    [case] = suite.findall("testcase")
    # Each character XML 1.0 cannot hold is a "?", the rest kept as typed.
    assert (case.get("classname"), case.get("name")) == ("bundle?", "step 1: type text=a??b")
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == failure.text == "differs ?"
