"""The controller's recorder: what enters its buffer of a command or file operation."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from corral.recording.redact import INPUT_PREFIX_BYTES
from corral.sandbox.recorder import Recorder

from .desktop_fake import FakeBrowser, Parts, fake_desktop


async def test_uploaded_bytes_and_long_outputs_never_enter_the_buffer_whole() -> None:
    recorder = Recorder(fake_desktop(Parts()))
    upload, printed = "u" * 100_000, "p" * 500_000
    write = {"type": "file_write", "path": "/workspace/f", "content": upload}
    run = {"type": "exec", "command": "cat /workspace/f", "cwd": "/workspace"}
    try:
        recorder.record({"request": {"id": 1, "action": write}, "native": [write], "ok": True, "reply": {"ok": True}})
        recorder.record(
            {
                "request": {"id": 2, "action": run},
                "native": [run],
                "ok": True,
                "reply": {"ok": True, "result": {"exit_code": 0, "stdout": printed, "stderr": "", "duration_ms": 9}},
            }
        )
        answer = await recorder.after(1, 10_000)  # waits for the second (events publish in order)
        first = (await recorder.after(0, 0))["events"][0]
    finally:
        await recorder.close()
    [ran] = answer["events"]
    assert first["request"]["action"]["content"] == "u" * INPUT_PREFIX_BYTES
    assert first["payloads"]["native.0.content"]["sha256"] == hashlib.sha256(upload.encode()).hexdigest()
    assert ran["reply"]["result"]["exit_code"] == 0 and ran["payloads"]["reply.result.stdout"]["size"] == 500_000
    assert len(json.dumps(ran)) < 64 << 10


async def test_a_file_transfer_is_recorded_without_a_frame_or_page_state() -> None:
    parts = Parts()
    recorder = Recorder(fake_desktop(parts))
    step = {"type": "file_upload", "path": "in.bin"}
    result = {"direction": "upload", "path": "/workspace/in.bin", "size": 3, "sha256": "ab" * 32}
    try:
        recorder.record(
            {
                "request": {"http": "PUT /v1/files"},
                "native": [step],
                "ok": True,
                "reply": {"ok": True, "result": result},
            },
            frame=False,
        )
        [event] = (await recorder.after(0, 10_000))["events"]
    finally:
        await recorder.close()
    assert "frame_webp" not in event and event["frame_skipped"] == "a file transfer over HTTP does not touch the screen"
    assert event["reply"]["result"] == result and event["seq"] == 1


async def test_a_note_is_recorded_as_it_is_in_order_with_the_requests_events() -> None:
    recorder = Recorder(fake_desktop(Parts()))
    write = {"type": "file_write", "path": "/workspace/f", "content": "x"}
    try:
        recorder.record(
            {"request": {"id": 1, "action": write}, "native": [write], "ok": True, "reply": {}}, frame=False
        )
        recorder.note({"event": "control", "change": "taken", "holder": "human:lnk_a", "previous": "agent"})
        await recorder.after(1, 10_000)  # waits for the note (events publish in order)
        first, noted = (await recorder.after(0, 0))["events"]
    finally:
        await recorder.close()
    assert first["seq"] == 1 and first["native"] == [write]
    assert noted["seq"] == 2 and noted["event"] == "control" and noted["holder"] == "human:lnk_a"
    assert noted["change"] == "taken" and noted["previous"] == "agent" and isinstance(noted["at"], float)
    assert not {"frame_webp", "frame_skipped", "reply", "title"} & set(noted)


async def test_what_strict_json_cannot_carry_is_recorded_as_it_can() -> None:
    # A request may hold a lone surrogate ("\\ud800" is valid JSON text); the gateway reads the buffer as
    # strict UTF-8 JSON, which failed with a 500 on every read after such a request (CI, test_files).
    recorder = Recorder(fake_desktop(Parts()))
    write = {"type": "file_write", "path": "/workspace/\ud800", "content": "x"}
    try:
        recorder.record(
            {"request": {"id": "\ud83d", "action": write}, "native": [write], "ok": False, "reply": {"x": 1.5}},
            frame=False,
        )
        recorder.note({"event": "control", "change": "taken", "holder": "human:lnk_a", "reason": "\udc00?"})
        await recorder.after(1, 10_000)
        answer = await recorder.after(0, 0)
    finally:
        await recorder.close()
    event, noted = answer["events"]
    json.dumps(answer, ensure_ascii=False, allow_nan=False).encode()  # what GET /v1/recording sends
    assert event["request"] == {
        "id": "\ufffd",
        "action": {"type": "file_write", "path": "/workspace/\ufffd", "content": "x"},
    }
    assert event["reply"] == {"x": 1.5} and noted["reason"] == "\ufffd?"


class _TitledBrowser(FakeBrowser):
    async def info_at_hand(self) -> dict[str, Any]:
        return {"url": "https://page.test/\ud800", "title": "evil \ud800"}


async def test_a_page_title_with_a_lone_surrogate_keeps_the_recording_readable() -> None:
    # The title and URL join the event once the action is done: a page sets them (review of 90c261e).
    recorder = Recorder(fake_desktop(Parts(), _TitledBrowser))
    key = {"type": "key", "keys": "a"}
    try:
        recorder.record({"request": {"id": 1, "action": key}, "native": [key], "ok": True, "reply": {"ok": True}})
        answer = await recorder.after(0, 10_000)
    finally:
        await recorder.close()
    json.dumps(answer, ensure_ascii=False, allow_nan=False).encode()
    [event] = answer["events"]
    assert event["title"] == "evil \ufffd" and event["url"] == "https://page.test/\ufffd"


async def test_an_events_page_state_is_read_from_what_is_at_hand() -> None:
    # A click's event must not start the Playwright driver (stopped while idle) just to read a title.
    parts = Parts()
    recorder = Recorder(fake_desktop(parts))
    click = {"type": "click", "x": 1, "y": 1}
    try:
        recorder.record({"request": {"id": 1, "action": click}, "native": [click], "ok": True, "reply": {"ok": True}})
        answer = await recorder.after(0, 10_000)
    finally:
        await recorder.close()
    [event] = answer["events"]
    assert event["title"] == "after info_at_hand"
    assert parts.methods("browser") == ["info_at_hand"]
