"""Session recordings, written by the gateway as the session goes (format: docs/recording.md).

One task per live session long-polls its controller for recorded events and appends them to
``<data_dir>/recordings/<session>/``: ``manifest.json``, ``events.jsonl`` (one line per request,
flushed as written) and ``frames/<seq>.webp``. A session killed mid-way leaves a bundle that is
readable up to its last written event. Each event also lists the audit-log records its action
caused (by ``action_id``) as far as the proxy had written them.

Everything here is bounded, since a session's content (and its controller) is untrusted: each
field of recorded text is cut to a size (noted in the event), each session has a byte budget for
events and frames (past it a ``budget`` event and the manifest note the cut, and nothing more is
stored), a fetch from the controller is read up to a size, listings read manifests and counts kept
in memory (never an events file), and all recordings together are held under a cap by removing
ended ones, oldest first.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import json
import logging
import mmap
import os
import shutil
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict, cast

import httpx

from corral.errors import ReplyTooLarge, UnprovenController
from corral.gateway import controller
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import open_private, private_dir, private_file, session_dir, write_json, write_private
from corral.proxy.audit import MAX_LINE_BYTES
from corral.proxy.flowfile import check
from corral.recording.bundle import (
    EVENTS_FILE,
    FORMAT,
    FRAMES_DIR,
    MANIFEST_FILE,
    RESPONSES_FILE,
    VERSION,
    EventFields,
    Manifest,
    RecordedEvent,
)
from corral.recording.redact import redact, redact_human

log = logging.getLogger(__name__)

OWNER_FILE = ".owner"  # the gateway's own note of who may read it; never part of a download
POLL_WAIT_MS = 10_000
DRAIN_S = 3.0  # at the end, how long to wait for frames the controller is still settling
MiB = 1 << 20
DEFAULT_BUDGET = 256 * MiB
DEFAULT_MAX_TEXT = 64 << 10
# One answer of the controller: its buffer holds at most 32 MiB (frames and text) plus one event, so
# anything past this is a controller that misbehaves; the recording is cut rather than the gateway fed.
FETCH_MAX_BYTES = 64 * MiB


@dataclass(frozen=True, slots=True)
class RecordingLimits:
    """What recordings may take (the gateway's settings, docs/recording.md)."""

    budget_bytes: int = DEFAULT_BUDGET  # events and frames of one session, unless it asks for another
    max_budget_bytes: int = 2048 * MiB  # the most a session may ask for
    max_text_bytes: int = DEFAULT_MAX_TEXT  # each field of recorded text in one event
    max_total_bytes: int = 10240 * MiB  # every recording in the data dir together
    fetch_max_bytes: int = FETCH_MAX_BYTES

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RecordingLimits:
        return cls(
            budget_bytes=settings.recording_budget_mb * MiB,
            max_budget_bytes=settings.recording_max_budget_mb * MiB,
            max_text_bytes=settings.recording_max_text_kb << 10,
            max_total_bytes=settings.recordings_max_total_mb * MiB,
        )

    def budget_for(self, asked_mb: int | None) -> int:
        asked = self.budget_bytes if asked_mb is None else asked_mb * MiB
        return min(asked, self.max_budget_bytes)


def _prefix(text: str, limit: int) -> str:
    return text.encode()[:limit].decode("utf-8", "ignore")


def _clip_strings(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return _prefix(value, limit) if len(value) > limit // 4 else value  # (a char is 1-4 bytes)
    if isinstance(value, dict):
        return {k: _clip_strings(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip_strings(v, limit) for v in value]
    return value


def clip(value: Any, limit: int) -> tuple[Any, int | None]:
    """``value`` cut to about ``limit`` bytes of JSON, and its size when it had to be cut (else None).

    A string keeps its first ``limit`` bytes; a structure keeps its shape with its long strings cut
    (so a ``native`` list stays a list), or, when that is still too much, becomes its JSON text cut
    to ``limit`` (None for a list, whose readers expect one).
    """
    if value is None or isinstance(value, bool | int | float):
        return value, None
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    size = len(text.encode())
    if size <= limit:
        return value, None
    if isinstance(value, str):
        return _prefix(value, limit), size
    clipped = _clip_strings(value, max(limit // 8, 64))
    if len(json.dumps(clipped, separators=(",", ":"), default=str).encode()) <= limit:
        return clipped, size
    return (None if isinstance(value, list) else _prefix(text, limit)), size


def _stored_bytes(directory: Path) -> int:
    """Bytes of events and frames on disk (a restarted gateway's start, or a bundle closed unseen)."""
    total = 0
    with contextlib.suppress(OSError):
        total += (directory / EVENTS_FILE).stat().st_size
    with contextlib.suppress(OSError), os.scandir(directory / FRAMES_DIR) as frames:
        for entry in frames:
            with contextlib.suppress(OSError):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def _count_lines(path: Path) -> int:
    """Events in a file, streamed (never read whole)."""
    count = 0
    with contextlib.suppress(OSError), path.open("rb") as lines:
        count = sum(1 for line in lines if line.strip())
    return count


class ControllerBatch(TypedDict, total=False):
    """One answer of the controller's ``GET /v1/recording`` (read field by field: it is untrusted)."""

    boot: str | None  # the controller run: its numbering starts again with another
    last: int  # the last event it has recorded
    oldest: int  # the oldest it still holds
    events: list[dict[str, Any]]  # its events as it sent them: redacted and clipped before they are stored


class RecordingSummary(TypedDict):
    """One recording in the owner's listing (``GET /v1/recordings``)."""

    session: str
    state: str  # live, ended
    created_at: float | None
    ended_at: float | None
    events: int | None
    bytes: int | None
    budget_bytes: int | None
    cut: str | None


class EventsPage(TypedDict):
    """The events a viewer has not seen yet, and whether more can come."""

    events: list[RecordedEvent]
    ended: bool


class AuditIndex:
    """Which audit records each action caused, read incrementally from the session's log."""

    def __init__(self, path: Path | None) -> None:
        self._path, self._offset = path, 0
        self._by_action: dict[str, list[int]] = {}

    def seqs(self, action_id: str | None) -> list[int]:
        if self._path is None or action_id is None:
            return []
        with contextlib.suppress(OSError), self._path.open("rb") as log_file:
            log_file.seek(self._offset)
            # Bounded reads: a line longer than any audit record goes by in pieces, none held whole.
            for line in iter(lambda: log_file.readline(MAX_LINE_BYTES + 1), b""):
                if not line.endswith(b"\n") and len(line) <= MAX_LINE_BYTES:
                    break  # being written: next time
                self._offset += len(line)
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    if record.get("action"):
                        self._by_action.setdefault(str(record["action"]), []).append(int(record["seq"]))
        return list(self._by_action.get(action_id, []))


class SessionRecorder:
    def __init__(
        self,
        directory: Path,
        base_url: str,
        audit: Path | None,
        http: httpx.AsyncClient,
        secret: str = "",
        budget_bytes: int = DEFAULT_BUDGET,
        max_text_bytes: int = DEFAULT_MAX_TEXT,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
    ) -> None:
        self.directory = directory
        self._base_url = base_url
        self._secret = secret  # the controller's per-boot secret: requests are signed, answers proven
        self._audit = AuditIndex(audit)
        self._http = http
        self.budget = budget_bytes
        self._max_text = max_text_bytes
        self._fetch_max = fetch_max_bytes
        self._after = 0
        self._written = 0
        self.used = 0  # bytes of events and frames stored
        self.cut: str | None = None  # why the recording stopped storing (budget, reply_too_large)
        self._controller_last = 0
        self._writing: asyncio.Future[None] | None = None
        self._boot: str | None = None  # the controller run whose numbering ``_after`` follows
        self._task: asyncio.Task[None] | None = None
        # (seq, byte offset) of each line of the events file, in order: a reader skips to the events it
        # lacks without reading the lines before them. One list of pairs: an append is atomic for a
        # reader on another thread.
        self._lines: list[tuple[int, int]] = []
        self._end = 0  # the events file's size as written

    @property
    def polling(self) -> bool:
        """Whether its loop polls the controller (never after a cut: nothing more would be stored)."""
        return self._task is not None and not self._task.done()

    def stop_polling(self) -> asyncio.Task[None] | None:
        """Cancel the poll loop, the bundle left open (gateway shutdown; a test stepping :meth:`fetch`
        itself); the loop's task, for the caller to await, or None when none ran."""
        if self._task is not None:
            self._task.cancel()
        return self._task

    @property
    def written(self) -> int:
        """Events in the bundle (the listing's count: no events file is read for it)."""
        return self._written

    def start(self, manifest: dict[str, Any], owner: str) -> None:  # the session's setup as its model dumps it
        private_dir(self.directory / FRAMES_DIR)
        manifest_path = self.directory / MANIFEST_FILE
        if not manifest_path.exists():
            write_json(
                manifest_path, {"format": FORMAT, "version": VERSION, **manifest, "budget_bytes": self.budget}, indent=2
            )
            write_private(self.directory / OWNER_FILE, owner)
        else:  # a restarted gateway carries on where it stopped, with the budget the session had
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                stored = json.loads(manifest_path.read_text())
                self.budget = int(stored.get("budget_bytes", self.budget))
                self.cut = (stored.get("cut") or {}).get("reason")
        events = self.directory / EVENTS_FILE
        with contextlib.suppress(FileNotFoundError), events.open("rb") as lines:
            for line in lines:  # streamed: bounded by the budget, and never held whole
                offset, self._end = self._end, self._end + len(line)
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    event = json.loads(line)
                    self._lines.append((int(event["seq"]), offset))
                    self._written = max(self._written, int(event["seq"]))
                    if event.get("event") == "controller_restarted":
                        self._after, self._boot = 0, event.get("controller_boot")
                    elif "controller_seq" in event:  # the controller's: an action or a control event
                        if event.get("controller_boot") != self._boot:
                            self._after = 0  # a new controller run: its numbering starts again
                        self._boot = event.get("controller_boot")
                        self._after = max(self._after, int(event.get("controller_seq", 0)))
        self.used = _stored_bytes(self.directory)
        if self.cut is None:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self.cut is None:
            try:
                await self.fetch(POLL_WAIT_MS)
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, UnprovenController) as exc:
                log.debug("recording fetch for %s failed: %s", self.directory.name, exc)
                await asyncio.sleep(0.5)
            except Exception:  # disk full, a pruned directory, a malformed event: say so, keep going
                log.exception("recording %s: could not write an event", self.directory.name)
                await asyncio.sleep(1)

    async def _get(self, wait_ms: int) -> ControllerBatch | None:
        """One answer of the controller, read up to ``fetch_max`` bytes (None: it does not record)."""
        async with controller.stream(
            self._http,
            self._base_url,
            self._secret,
            "GET",
            "/v1/recording",
            params={"after": self._after, "wait_ms": wait_ms},
            timeout=wait_ms / 1000 + 2,
        ) as response:
            if response.status_code == 404:
                return None
            response.raise_for_status()
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._fetch_max:
                raise ReplyTooLarge(f"the controller's answer declares {declared} bytes")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._fetch_max:
                    raise ReplyTooLarge(f"the controller's answer is over {self._fetch_max} bytes")
                chunks.append(chunk)
        body = json.loads(b"".join(chunks))
        if not isinstance(body, dict):
            raise ValueError("the controller's answer is not an object")
        return cast(ControllerBatch, body)

    async def fetch(self, wait_ms: int) -> None:
        """One poll of the controller: what it recorded since the last, written to the bundle (its loop
        and the final drain call this; tests call it to step the recorder without its loop)."""
        if self.cut is not None:
            return
        try:
            body = await self._get(wait_ms)
        except ReplyTooLarge as exc:
            log.warning("recording %s cut: %s", self.directory.name, exc)
            await asyncio.to_thread(self._cut, "reply_too_large")
            return
        if body is None:
            await asyncio.sleep(5)  # this controller does not record
            return
        self._controller_last = int(body.get("last", 0))
        boot = body.get("boot")
        restarted = (self._boot is not None and boot != self._boot) or int(body.get("last", 0)) < self._after
        if restarted:
            # Another run of the controller (its numbering starts again), even if it has caught up
            # with the old count: without the boot id, a restart would look like old events.
            self._write({"event": "controller_restarted", "controller_boot": boot})
            self._after, self._boot = 0, boot
            return
        self._boot = boot
        if body.get("events") and int(body.get("oldest", 1)) > self._after + 1:
            self._write({"event": "gap", "lost": int(body["oldest"]) - self._after - 1})
        for event in body.get("events", []):
            if self.cut is not None:
                break
            # File writes off the event loop; shielded, so a cancelled task never leaves an event
            # written but not counted (it would be fetched and written again).
            self._writing = asyncio.ensure_future(asyncio.to_thread(self._write_action, event))
            await asyncio.shield(self._writing)

    def _write_action(self, event: dict[str, Any]) -> None:  # as the controller sent it (ControllerBatch)
        # Again here, with this gateway's cap: the controller is not trusted to have done it (or may be
        # older), and a second pass keeps the first digests.
        event = redact(event, output_budget=self._max_text * 3 // 4)
        frame_b64 = event.pop("frame_webp", None)
        controller_seq = int(event.pop("seq"))
        seq = self._written + 1
        cut: dict[str, int] = {}
        for name in list(event):
            value, size = clip(event[name], self._max_text)
            if size is not None:
                event[name], cut[name] = value, size
        frame_bytes = base64.b64decode(frame_b64) if isinstance(frame_b64, str) and frame_b64 else b""
        frame = f"{FRAMES_DIR}/{seq:06d}.webp" if frame_bytes else None
        record = {"event": "action", "controller_seq": controller_seq, "controller_boot": self._boot, **event}
        if record["event"] == "action":
            # Another event of the controller's (a change of the control lease) keeps its own name,
            # and has neither a frame nor an action in the audit log.
            record["frame"] = frame
            record["audit"] = self._audit.seqs(event.get("action_id"))
        if cut:
            record["truncated"] = cut  # field -> its size as received, in bytes
        line = self._line(seq, record)
        if self.used + len(line) + len(frame_bytes) > self.budget:
            self._cut("budget")
            return
        if frame is not None:
            fd = open_private(self.directory / frame)
            with os.fdopen(fd, "wb") as out:
                out.write(frame_bytes)
        self._append(seq, line)
        self.used += len(frame_bytes)
        self._after = controller_seq  # only once written: a failed write is fetched again

    @staticmethod
    def _line(seq: int, event: Mapping[str, Any]) -> bytes:  # an EventFields, or one from the controller
        return (json.dumps({"seq": seq, "time": time.time(), **event}, separators=(",", ":")) + "\n").encode()

    def _append(self, seq: int, line: bytes) -> None:
        fd = open_private(self.directory / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)  # one write per event: a kill never leaves half of one
        finally:
            os.close(fd)
        self._lines.append((seq, self._end))
        self._end += len(line)
        self._written = seq
        self.used += len(line)

    def offset_after(self, seq: int) -> int:
        """Where the events file's first line with a seq above ``seq`` starts (its end if none)."""
        lines = self._lines
        index = bisect.bisect_right(lines, seq, key=lambda line: line[0])
        return lines[index][1] if index < len(lines) else self._end

    def _write(self, event: EventFields) -> None:
        seq = self._written + 1
        self._append(seq, self._line(seq, event))

    def _cut(self, reason: str) -> None:
        """Stop storing: one ``budget`` event (the only write past the budget) and the manifest say
        where and why; the session goes on unrecorded."""
        if self.cut is not None:
            return
        self.cut = reason
        after = self._written
        self._write({"event": "budget", "reason": reason, "budget_bytes": self.budget, "used_bytes": self.used})
        manifest_path = self.directory / MANIFEST_FILE
        with contextlib.suppress(OSError, ValueError):
            manifest = json.loads(manifest_path.read_text())
            manifest["cut"] = {"reason": reason, "at": time.time(), "after_seq": after, "budget_bytes": self.budget}
            write_json(manifest_path, manifest, indent=2)

    def note(self, event: EventFields) -> None:
        """One event of the gateway's own (a ``resume`` marker) into the bundle, unless it was cut."""
        if self.cut is None:
            self._write(event)

    async def _end_connections(self, wait_s: float) -> None:
        """The controller's CDP connections ended before the last read (for up to ``wait_s``): their
        ``disconnected`` comes once the relay has ended, which is after the gateway's door closed,
        and the read came first. A controller that cannot (an older one, gone) is drained as it is."""
        with contextlib.suppress(httpx.HTTPError, UnprovenController):
            await controller.request(
                self._http,
                self._base_url,
                self._secret,
                "POST",
                "/v1/cdp/close",
                params={"wait_ms": int(wait_s * 1000)},
                json={},
                timeout=wait_s + 1,
            )

    async def stop(
        self, reason: str, drain_s: float = DRAIN_S, *, close: bool = True, marker: EventFields | None = None
    ) -> None:
        """Take what the controller still holds (for up to ``drain_s``), then close the bundle; or,
        not ``close`` (a pause), write ``marker`` and leave it open for the next controller's events."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)  # an event being written
        try:
            # The last frames may still be settling in the controller: wait for them, briefly.
            async with asyncio.timeout(drain_s):
                deadline = time.monotonic() + drain_s
                await self._end_connections(drain_s / 2)
                await self.fetch(0)
                while self.cut is None and self._after < self._controller_last:
                    await self.fetch(int(max(0.0, deadline - time.monotonic()) * 1000))
        except (TimeoutError, httpx.HTTPError, ValueError, OSError, UnprovenController) as exc:
            log.info("recording %s: stopped draining (%s)", self.directory.name, type(exc).__name__)
        finally:
            if self._writing is not None:
                # The event being written lands before the manifest says ended (ended means complete).
                with contextlib.suppress(BaseException):
                    async with asyncio.timeout(5.0):
                        await asyncio.shield(self._writing)
            if marker is not None:
                self.note(marker)
            # Closed whatever happened above, even when cancelled: an ended session's bundle says so.
            if close:
                close_manifest(self.directory, reason, self._written, self.used)


def close_manifest(directory: Path, reason: str, events: int | None = None, size: int | None = None) -> None:
    manifest_path = directory / MANIFEST_FILE
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("ended_at"):
            return
        if events is None:
            events = _count_lines(directory / EVENTS_FILE)
        if size is None:
            size = _stored_bytes(directory)
        manifest.update(ended_at=time.time(), end_reason=reason, events=events, bytes=size)
        write_json(manifest_path, manifest, indent=2)


def _redacted_line(line: bytes) -> bytes:
    """An events file's line with a person's typing left out: what the recorder does to every event
    it writes, done again as one is read, for bundles an older gateway wrote (other lines as they are)."""
    if b'"human' not in line:
        return line
    try:
        event = json.loads(line)
    except ValueError:
        return line
    if not isinstance(event, dict):
        return line
    redacted = redact_human(event)
    if redacted is event:
        return line
    return (json.dumps(redacted, separators=(",", ":")) + "\n").encode()


def _copy_events(source: IO[bytes], out: IO[bytes]) -> None:
    """The events file, line by line (a budget bounds it; it is never held whole), redacted."""
    for line in source:
        out.write(_redacted_line(line))


def _copy(source: IO[bytes], out: IO[bytes], length: int) -> None:
    while length > 0:
        chunk = source.read(min(length, 1 << 20))
        if not chunk:
            break
        out.write(chunk)
        length -= len(chunk)


def _complete_length(path: Path) -> int | None:
    """How much of a responses file is whole flows (the proxy may be writing the next one); None
    when it is missing or no flow file."""
    try:
        with path.open("rb") as source:
            if os.fstat(source.fileno()).st_size == 0:
                return 0
            with mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data, memoryview(data) as view:
                return check(view).complete
    except OSError:
        return None
    except ValueError as exc:
        log.error("%s is not a mitmproxy flow file (%s); left out of the bundle", path, exc)
        return None


class RecordingManager:
    def __init__(self, root: Path, limits: RecordingLimits | None = None) -> None:
        self.root = root
        self.limits = limits or RecordingLimits()
        self._live: dict[str, SessionRecorder] = {}
        # The proxy's responses file of each session whose file has not moved into its bundle yet
        # (from the start until just after the proxy is gone), so a download always includes it.
        self._pending_responses: dict[str, Path] = {}

    def directory(self, session_id: str) -> Path:
        return session_dir(self.root, session_id)

    def start(
        self,
        session_id: str,
        base_url: str,
        audit: Path | None,
        http: httpx.AsyncClient,
        manifest: dict[str, Any],
        owner: str,
        responses: Path | None = None,
        budget_mb: int | None = None,
        secret: str = "",
    ) -> None:
        """Record a session (or carry on with its bundle); ``budget_mb`` is what the session asked
        for, held to the cap (a carried-on bundle keeps the budget it was given)."""
        private_dir(self.root)
        recorder = SessionRecorder(
            self.directory(session_id),
            base_url,
            audit,
            http,
            secret,
            budget_bytes=self.limits.budget_for(budget_mb),
            max_text_bytes=self.limits.max_text_bytes,
            fetch_max_bytes=self.limits.fetch_max_bytes,
        )
        recorder.start({"session": session_id, **manifest}, owner)
        self._live[session_id] = recorder
        if responses is not None:
            self._pending_responses[session_id] = responses

    async def stop(self, session_id: str, reason: str, drain_s: float = DRAIN_S) -> None:
        recorder = self._live.pop(session_id, None)
        if recorder is not None:
            await recorder.stop(reason, drain_s)
            await asyncio.to_thread(self.enforce_total)  # an ended bundle may now be pruned to fit

    async def pause(self, session_id: str, marker: EventFields, drain_s: float = DRAIN_S) -> None:
        """A paused session: its controller's last events taken, the ``pause`` marker written, the
        bundle left open (:meth:`start` carries it on at the resume)."""
        recorder = self._live.pop(session_id, None)
        if recorder is not None:
            await recorder.stop("paused", drain_s, close=False, marker=marker)

    def close_ended(self, session_id: str, reason: str, responses: Path | None) -> None:
        """A session that ended unseen (lost while the gateway was down): close its bundle."""
        directory = self.directory(session_id)
        if not (directory / MANIFEST_FILE).exists():
            return
        close_manifest(directory, reason)
        if responses is not None:
            self.attach_responses(session_id, responses)
        self.enforce_total()

    def attach_responses(self, session_id: str, responses: Path) -> None:
        """The ended session's recorded responses move into its bundle (its proxy is gone: complete)."""
        directory = self.directory(session_id)
        self._pending_responses.pop(session_id, None)
        complete = _complete_length(responses)
        if complete is None or not directory.exists():
            return
        with responses.open("rb") as source, private_file(directory / RESPONSES_FILE, None) as out:
            _copy(source, out, complete)  # streamed: the file can be hundreds of MB
        responses.unlink(missing_ok=True)  # one copy, in the bundle

    async def stop_all(self) -> None:
        """Gateway shutdown: the sessions go on, so the bundles stay open (a restart continues them)."""
        tasks = [task for recorder in self._live.values() if (task := recorder.stop_polling()) is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._live.clear()

    def live(self, session_id: str) -> SessionRecorder | None:
        """The session's recorder while it records (None once stopped, or never started)."""
        return self._live.get(session_id)

    def owner(self, session_id: str) -> str | None:
        try:
            return (self.directory(session_id) / OWNER_FILE).read_text().strip()
        except (OSError, ValueError):
            return None

    def listing(self, owner: str) -> list[RecordingSummary]:
        """The owner's recordings, from their manifests and the live recorders' counts: the cost is
        one small file each, whatever the recordings hold (no events file is opened)."""
        out: list[RecordingSummary] = []
        for path in self.root.glob(f"ses_*/{MANIFEST_FILE}"):
            session_id = path.parent.name
            if self.owner(session_id) != owner:
                continue
            with contextlib.suppress(OSError, ValueError, AttributeError):
                manifest = json.loads(path.read_text())
                live = self._live.get(session_id)
                out.append(
                    {
                        "session": session_id,
                        "state": "live" if live is not None else "ended",
                        "created_at": manifest.get("created_at"),
                        "ended_at": manifest.get("ended_at"),
                        "events": live.written if live is not None else manifest.get("events"),
                        "bytes": live.used if live is not None else manifest.get("bytes"),
                        "budget_bytes": manifest.get("budget_bytes"),
                        "cut": (manifest.get("cut") or {}).get("reason"),
                    }
                )
        return sorted(out, key=lambda item: item["created_at"] or 0, reverse=True)

    def events(self, session_id: str, after: int = 0) -> EventsPage:
        """The bundle's events with ``seq > after`` (for the viewer) and whether the recording has ended.

        ``{"events": [...], "ended": bool}``; a torn last line is left out. Once ``ended`` is true no
        event will follow, so a reader can stop asking.
        """
        directory = self.directory(session_id)
        # The manifest first: the recorder writes ``ended_at`` only after the last event, so an
        # ended manifest read before the events means the events read are complete.
        try:
            ended = json.loads((directory / MANIFEST_FILE).read_text()).get("ended_at") is not None
        except (OSError, ValueError, AttributeError):
            ended = False
        # A live recording knows where each line starts: the ones already read are not read again. An
        # ended one is read whole, once (the viewer stops asking once it has ended).
        live = self._live.get(session_id)
        start = live.offset_after(after) if live is not None else 0
        out: list[RecordedEvent] = []
        try:
            with (directory / EVENTS_FILE).open("rb") as events:
                events.seek(start)
                lines = events.read().split(b"\n")
        except FileNotFoundError:
            lines = []
        for line in lines:
            if not line.strip():
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and isinstance(event.get("seq"), int) and event["seq"] > after:
                    # A line of the bundle (checked as far as the viewer relies on it); a bundle an older
                    # gateway wrote holds a person's text: left out here.
                    out.append(cast(RecordedEvent, redact_human(event)))
        return {"events": out, "ended": ended}

    def frame(self, session_id: str, name: str) -> bytes:
        """One frame by its file name (``000001.webp``); raises ValueError for anything else."""
        if not (name.endswith(".webp") and name[:-5].isdigit()):
            raise ValueError(f"not a frame name: {name!r}")
        return (self.directory(session_id) / FRAMES_DIR / name).read_bytes()

    def zip(self, session_id: str, out: IO[bytes]) -> None:
        """The bundle as a .zip written to ``out`` (the owner note left out), readable even
        mid-session, when the live responses file is taken up to its last complete flow. Frames are
        stored as they are (WebP does not compress further); the rest is deflated."""
        directory = self.directory(session_id)
        if not (directory / MANIFEST_FILE).exists():
            raise FileNotFoundError(f"no recording of {session_id}")
        pending = self._pending_responses.get(session_id)
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted(directory.rglob("*")):
                if path == directory / EVENTS_FILE:
                    with (
                        path.open("rb") as source,
                        bundle.open(f"{session_id}/{EVENTS_FILE}", "w", force_zip64=True) as member,
                    ):
                        _copy_events(source, member)
                elif path.is_file() and path.name != OWNER_FILE and path.suffix != ".tmp":
                    stored = path.suffix == ".webp"
                    bundle.write(
                        path,
                        f"{session_id}/{path.relative_to(directory).as_posix()}",
                        compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED,
                    )
            if pending is not None and not (directory / RESPONSES_FILE).exists():
                complete = _complete_length(pending)
                if complete is not None:
                    with (
                        pending.open("rb") as source,
                        bundle.open(f"{session_id}/{RESPONSES_FILE}", "w", force_zip64=True) as member,
                    ):
                        _copy(source, member, complete)

    def prune(self, retention_s: float) -> int:
        """Ended recordings past the retention go, then the oldest ended ones past the total cap."""
        removed, cutoff = 0, time.time() - retention_s
        for path in self.root.glob(f"ses_*/{MANIFEST_FILE}"):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                ended = json.loads(path.read_text()).get("ended_at")
                if ended and ended < cutoff and path.parent.name not in self._live:
                    shutil.rmtree(path.parent, ignore_errors=True)
                    removed += 1
        return removed + self.enforce_total()

    def _size(self, directory: Path, manifest: Manifest | None) -> int:
        live = self._live.get(directory.name)
        if live is not None:
            size = live.used
        elif manifest is not None and isinstance(manifest.get("bytes"), int):
            size = int(manifest["bytes"])
        else:
            size = _stored_bytes(directory)  # an older bundle, or one never closed: counted once
        with contextlib.suppress(OSError):
            size += (directory / RESPONSES_FILE).stat().st_size
        return size

    def enforce_total(self) -> int:
        """Remove ended recordings, oldest first, until all of them fit ``max_total_bytes``; live
        ones are never removed (their budgets bound them). Reads manifests only (and one stat each)."""
        total, ended = 0, []
        for directory in self.root.glob("ses_*"):
            manifest: Manifest | None = None  # as read: each value used is checked
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads((directory / MANIFEST_FILE).read_text())
                manifest = cast(Manifest, loaded) if isinstance(loaded, dict) else None
            size = self._size(directory, manifest)
            total += size
            ended_at = manifest.get("ended_at") if manifest is not None else None
            if directory.name not in self._live and isinstance(ended_at, int | float) and ended_at:
                ended.append((float(ended_at), directory.name, size, directory))
        removed = 0
        for _, _, size, directory in sorted(ended):
            if total <= self.limits.max_total_bytes:
                break
            log.info("recording %s removed: all recordings exceed their cap", directory.name)
            shutil.rmtree(directory, ignore_errors=True)
            total -= size
            removed += 1
        return removed
