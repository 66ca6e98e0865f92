"""Recordings are bounded (issue 10): a byte budget per session whose cut is noted, recorded text
cut per field, controller answers read up to a size, listings that never open an events file, and
a cap on all recordings that removes ended ones oldest first."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from corral.gateway.recording import RecordingLimits, RecordingManager, SessionRecorder, clip
from corral.recording.bundle import read_bundle
from corral.recording.replay import ReplayOptions, recording_warnings, replay

from .controller_fake import SECRET, proving

SID = "ses_0123456789abcdef"
FRAME = b"RIFF" + b"\x01" * 4000  # stands in for a WebP frame: 4 KB


class Controller:
    """Serves /v1/recording like a sandbox's controller; counts the fetches it answered."""

    def __init__(self, frame: bytes = FRAME, request: Any = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.fetches = 0
        self.frame, self.request = frame, request

    def act(self, count: int) -> None:
        for _ in range(count):
            self.events.append(
                {
                    "seq": len(self.events) + 1,
                    "request": self.request if self.request is not None else {"id": "x"},
                    "native": [{"type": "screenshot"}],
                    "ok": True,
                    "frame_webp": base64.b64encode(self.frame).decode(),
                }
            )

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.fetches += 1
        after = int(request.url.params.get("after", 0))
        events = [e for e in self.events if e["seq"] > after]
        return httpx.Response(200, json={"events": events, "oldest": 1, "last": len(self.events), "boot": "b"})


def _events(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "events.jsonl").read_text().splitlines()]


def _on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in [directory / "events.jsonl", *(directory / "frames").iterdir()])


def _recorder(directory: Path, controller: Controller, **limits: int) -> SessionRecorder:
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller.handler)))
    recorder = SessionRecorder(directory, "http://sandbox", None, client, SECRET, **limits)
    recorder.start({"session": directory.name, "viewport": {"width": 1, "height": 1}}, "key-a")
    recorder.stop_polling()  # the test drives the fetches itself
    return recorder


async def test_the_budget_cuts_the_recording_notes_it_and_stores_nothing_more(tmp_path: Path) -> None:
    directory = tmp_path / SID
    controller = Controller()
    controller.act(100)  # 100 events of 4 KB frames against a 40 KB budget
    recorder = _recorder(directory, controller, budget_bytes=40_000)
    await recorder.fetch(0)
    events = _events(directory)
    assert events[-1]["event"] == "budget" and events[-1]["reason"] == "budget"
    assert events[-1]["budget_bytes"] == 40_000
    stored = [e for e in events if e["event"] == "action"]
    assert 5 <= len(stored) < 10
    assert all(e["frame"] and (directory / e["frame"]).exists() for e in stored)
    assert len(list((directory / "frames").iterdir())) == len(stored)  # no frame past the cut
    marker = len(json.dumps(events[-1])) + 64
    assert _on_disk(directory) <= 40_000 + marker  # the marker is the only write past the budget
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["budget_bytes"] == 40_000
    assert manifest["cut"]["reason"] == "budget" and manifest["cut"]["after_seq"] == len(stored)
    # The session goes on, its recording does not: more actions, no more fetches or writes.
    size, fetches = _on_disk(directory), controller.fetches
    controller.act(50)
    await recorder.fetch(0)
    assert (_on_disk(directory), controller.fetches) == (size, fetches)
    await recorder.stop("deleted", drain_s=0.5)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["ended_at"] and manifest["events"] == len(stored) + 1 and manifest["bytes"] == _on_disk(directory)
    assert read_bundle(directory).events[-1]["event"] == "budget"
    assert any("stopped at event" in w for w in recording_warnings(read_bundle(directory)))


async def test_a_restarted_gateway_keeps_the_budget_and_the_cut(tmp_path: Path) -> None:
    directory = tmp_path / SID
    controller = Controller()
    controller.act(3)
    first = _recorder(directory, controller, budget_bytes=20_000)
    await first.fetch(0)
    used = first.used
    assert used == _on_disk(directory) and first.cut is None
    # A restarted gateway with a larger default: the session keeps the budget it was given.
    second = _recorder(directory, controller, budget_bytes=10 << 20)
    assert (second.budget, second.used, second.written) == (20_000, used, 3)
    controller.act(20)
    await second.fetch(0)
    assert second.cut == "budget"
    third = _recorder(directory, controller, budget_bytes=10 << 20)
    assert third.cut == "budget" and not third.polling  # nothing more is fetched after a restart either


async def test_recorded_text_is_cut_per_field_and_noted(tmp_path: Path) -> None:
    directory = tmp_path / SID
    huge = {"id": "big", "action": {"type": "type", "text": "é" * 600_000}}  # 1.2 MB of UTF-8
    controller = Controller(request=huge)
    controller.act(1)
    controller.events[0]["native"] = [{"type": "type", "text": "é" * 600_000}]
    controller.events[0]["reply"] = {"ok": True, "text": "x" * (1 << 20)}
    controller.events[0]["title"] = "t" * 100_000
    recorder = _recorder(directory, controller, max_text_bytes=4096)
    await recorder.fetch(0)
    line = (directory / "events.jsonl").read_bytes()
    assert len(line) < 6 * 4096  # each cut field at most the cap (JSON escaping aside)
    (event,) = _events(directory)
    sizes = event["truncated"]
    assert sizes["request"] > 1_200_000 and sizes["native"] > 1_200_000
    assert sizes["reply"] > 1 << 20 and sizes["title"] == 100_000
    assert isinstance(event["native"], list) and event["native"][0]["type"] == "type"  # the shape stays
    assert event["request"]["action"]["type"] == "type" and event["title"] == "t" * 4096
    assert "ok" not in sizes and event["ok"] is True
    # A replay does not send a request it only has part of: the step is skipped, and says why.
    await recorder.stop("deleted", drain_s=0.1)
    bundle = read_bundle(directory)
    sent: list[dict[str, Any]] = []
    report = replay(bundle, lambda request: sent.append(request) or {"ok": True}, ReplayOptions())
    assert sent == []
    assert report.steps[0].status == "skipped" and "cut" in report.steps[0].reason
    assert any("cut when recorded" in w for w in report.warnings)


def test_clip_keeps_small_values_and_shapes() -> None:
    assert clip({"a": 1}, 100) == ({"a": 1}, None)
    assert clip("abc", 2) == ("ab", 3)
    assert clip(7, 1) == (7, None)
    many = [{"type": "click", "x": i} for i in range(10_000)]  # no long string: too big even clipped
    value, size = clip(many, 1000)
    assert value is None and size is not None and size > 1000  # a list never becomes a string
    value, size = clip({"k": ["y" * 10] * 10_000}, 1000)
    assert isinstance(value, str) and len(value) <= 1000


async def test_an_oversized_answer_is_not_read_whole_and_cuts_the_recording(tmp_path: Path) -> None:
    directory = tmp_path / SID

    def flood(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"events": ['
            for _ in range(10_000):
                yield b"x" * 65536  # 640 MiB, if anyone read it all

        return httpx.Response(200, content=body())

    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(flood)))
    recorder = SessionRecorder(directory, "http://sandbox", None, client, SECRET, fetch_max_bytes=1 << 20)
    recorder.start({"session": SID, "viewport": {"width": 1, "height": 1}}, "key-a")
    assert recorder.polling
    recorder.stop_polling()
    tracemalloc.start()
    try:
        await recorder.fetch(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert recorder.cut == "reply_too_large" and _events(directory)[-1]["reason"] == "reply_too_large"


class _Opens:
    """Records every file opened (a Python audit hook, which cannot be removed: armed per test)."""

    armed: ClassVar[bool] = False
    seen: ClassVar[list[str]] = []

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if cls.armed and event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
            cls.seen.append(os.fsdecode(args[0]))


sys.addaudithook(_Opens.hook)


async def test_the_listing_reads_manifests_never_events_files(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path / "recordings")
    # An ended recording with a big events file planted (sparse: 1 GiB on no disk).
    ended = manager.directory("ses_0000000000000001")
    (ended / "frames").mkdir(parents=True)
    (ended / "manifest.json").write_text(
        json.dumps({"format": "corral-recording", "version": 1, "created_at": 1.0, "ended_at": 2.0, "events": 7})
    )
    (ended / ".owner").write_text("key-a")
    with (ended / "events.jsonl").open("wb") as planted:
        planted.truncate(1 << 30)
    # And a live one, whose count comes from its recorder.
    live = await _live(manager, "ses_0000000000000002", 3, created_at=3.0)
    _Opens.seen.clear()
    _Opens.armed = True
    tracemalloc.start()
    try:
        started = time.perf_counter()
        rows = manager.listing("key-a")
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        _Opens.armed = False
    assert not [path for path in _Opens.seen if path.endswith("events.jsonl")]
    assert peak < 1 << 20 and elapsed < 1.0
    by_id = {row["session"]: row for row in rows}
    assert by_id["ses_0000000000000001"]["events"] == 7 and by_id["ses_0000000000000001"]["state"] == "ended"
    assert by_id["ses_0000000000000002"]["events"] == 3 and by_id["ses_0000000000000002"]["state"] == "live"
    assert by_id["ses_0000000000000002"]["bytes"] == live.used > 0
    assert manager.listing("key-b") == []
    await manager.stop("ses_0000000000000002", "deleted", drain_s=0.1)


async def _live(manager: RecordingManager, session_id: str, events: int, created_at: float) -> SessionRecorder:
    """A live recording whose controller has served ``events`` events, fetched once (its task stopped)."""
    controller = Controller()
    controller.act(events)
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller.handler)))
    manager.start(session_id, "http://sandbox", None, client, {"created_at": created_at}, "key-a", secret=SECRET)
    live = manager.live(session_id)
    assert live is not None and live.polling
    live.stop_polling()
    await live.fetch(0)
    return live


def _ended(manager: RecordingManager, number: int, ended_at: float, size: int, in_manifest: bool = True) -> Path:
    directory = manager.directory(f"ses_{number:016d}")
    (directory / "frames").mkdir(parents=True)
    (directory / "frames" / "000001.webp").write_bytes(b"\0" * size)
    manifest: dict[str, Any] = {"format": "corral-recording", "version": 1, "created_at": 0, "ended_at": ended_at}
    if in_manifest:
        manifest["bytes"] = size
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


async def test_all_recordings_are_held_under_the_cap_oldest_ended_first(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path / "recordings", RecordingLimits(max_total_bytes=10_000))
    oldest = _ended(manager, 1, ended_at=100.0, size=4000)
    middle = _ended(manager, 2, ended_at=200.0, size=4000, in_manifest=False)  # an older bundle: sized on disk
    newest = _ended(manager, 3, ended_at=300.0, size=4000)
    (newest / "responses.mitm").write_bytes(b"\0" * 1000)  # its recorded responses count too
    live = await _live(manager, "ses_0000000000000009", 1, created_at=400.0)
    assert live.used > 4000
    # 4000 + 4000 + 5000 + the live one's > 10 000: the oldest ended go until it fits; the live one stays.
    assert manager.enforce_total() == 2
    assert not oldest.exists() and not middle.exists() and newest.exists()
    assert manager.directory("ses_0000000000000009").exists()
    assert manager.enforce_total() == 0
    # Retention and the cap together (the hourly prune): nothing past the retention here, and it fits.
    assert manager.prune(retention_s=86400 * 365 * 100) == 0
    # The live one ends: now it is the newest ended one; the cap removes the older first.
    manager.limits = RecordingLimits(max_total_bytes=live.used + 100)
    await manager.stop("ses_0000000000000009", "deleted", drain_s=0.1)
    assert not newest.exists() and manager.directory("ses_0000000000000009").exists()


@pytest.mark.parametrize(("asked", "expected"), [(None, 256 << 20), (8, 8 << 20), (1 << 20, 2048 << 20)])
def test_a_session_asks_for_a_budget_up_to_the_cap(asked: int | None, expected: int) -> None:
    assert RecordingLimits().budget_for(asked) == expected


def test_the_audit_index_reads_a_line_longer_than_any_record_in_pieces(tmp_path: Path) -> None:
    from corral.gateway.recording import AuditIndex
    from corral.proxy.audit import MAX_LINE_BYTES

    log = tmp_path / "audit.jsonl"
    log.write_bytes(
        b'{"seq":1,"action":"a1"}\n' + b"x" * (3 * MAX_LINE_BYTES) + b"\n" + b'{"seq":3,"action":"a1"}\n{"seq":4,'
    )
    index = AuditIndex(log)
    assert index.seqs("a1") == [1, 3]  # the torn last line waits for its end
    with log.open("ab") as out:
        out.write(b'"action":"a1"}\n')
    assert index.seqs("a1") == [1, 3, 4]
