"""The recording bundle, version 1: a directory (or a .zip of one) holding

- ``manifest.json``: ``{"format": "corral-recording", "version": 1, "session", "created_at",
  "ended_at", "viewport": {"width", "height"}, "allow", "egress_mode", ...}``;
- ``events.jsonl``: one JSON object per line, in order (``seq`` from 1); ``event`` is ``action``
  (a request: ``request`` as received, ``dialect``, ``native``, ``ok``, ``error``, ``reply``,
  ``started``, ``elapsed_ms``, ``url``, ``title``, ``frame``, ``audit``; ``truncated`` names the
  fields cut to the gateway's text cap, with their sizes; ``payloads``, for commands and file
  operations, the size and sha256 of each upload and output and whether only its start was kept:
  corral.recording.redact), ``gap``, ``controller_restarted``, ``budget`` (the last event: the
  recording stopped there, the manifest's ``cut`` says why) or ``control`` (a change of the control
  lease: ``change``, ``holder``, ``previous``, ``note``?, ``reason``?; no frame);
- ``frames/<seq>.webp``: the screen after each action;
- ``responses.mitm`` (when the session had egress control): every upstream answer its proxy let
  through, as a mitmproxy flow file, for hermetic replays (request credentials blanked; bodies and
  the sites' cookies kept).

Reading is strict about what it needs and says exactly what is wrong (:class:`BundleError`); a
torn last line (a session killed mid-write) is dropped, so a cut-short bundle reads up to its end.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict, cast

from corral.errors import BundleError as BundleError  # the format's error, kept importable from here
from corral.errors import ErrorDetail
from corral.proxy.flowfile import check

if TYPE_CHECKING:
    # A type only: redact reads key names with protocol.keys (python-xlib), which a client install lacks.
    from corral.recording.redact import Payload

FORMAT = "corral-recording"
VERSION = 1
MANIFEST_FILE = "manifest.json"
EVENTS_FILE = "events.jsonl"
FRAMES_DIR = "frames"
RESPONSES_FILE = "responses.mitm"


class Viewport(TypedDict):
    width: int
    height: int


class Cut(TypedDict):
    """Why and where a recording stopped storing (the manifest's ``cut``)."""

    reason: str  # budget, reply_too_large
    at: float
    after_seq: int
    budget_bytes: int


class Manifest(TypedDict, total=False):
    """``manifest.json``: the format, then the session's setup as it was created (its fields as the
    gateway's session model names them), the budget, and how it ended."""

    format: Required[str]
    version: Required[int]
    session: str
    created_at: float
    viewport: Viewport
    allow: list[str]
    egress_mode: str
    budget_bytes: int
    cut: Cut
    ended_at: float
    end_reason: str
    events: int
    bytes: int


class EventFields(TypedDict, total=False):
    """What one event of ``events.jsonl`` says (:class:`RecordedEvent` adds its number)."""

    time: float
    event: str  # action (the controller leaves it out), gap, controller_restarted, budget, control, pause, resume
    controller_seq: int
    controller_boot: str | None
    request_seq: int
    action_id: str | None
    actor: str
    started: float
    elapsed_ms: float
    dialect: str
    request: dict[str, Any]  # the request as received: any dialect's, open-ended
    native: list[dict[str, Any]]  # the native actions it was planned into, as JSON (each its own fields)
    ok: bool
    error: ErrorDetail | None
    reply: dict[str, Any]  # the reply as sent: its result is each action's own
    url: str | None
    title: str | None
    frame: str | None
    frame_webp: str  # the controller's, base64: the gateway stores it as ``frame``
    frame_at: float  # when the frame was taken
    frame_settled: bool  # the screen was still when it was taken
    frame_skipped: bool  # a later request came before the screen settled: no frame
    audit: list[int]
    truncated: dict[str, int]  # field -> its size as received, in bytes
    payloads: dict[str, Payload]  # dotted path -> what the value stood for
    lost: int  # gap
    reason: str  # budget
    budget_bytes: int
    used_bytes: int
    change: str  # control
    holder: str
    previous: str
    note: str
    at: float
    saved: dict[str, int]  # pause, resume: what was saved of the sandbox (directory -> bytes)
    tabs: int  # pause, resume: the open tabs carried over


class RecordedEvent(EventFields, total=False):
    """One line of ``events.jsonl`` (and, before the gateway stores it, one event of the controller's).

    An ``action`` carries the request and its reply; ``gap``, ``controller_restarted``, ``budget``
    and ``control`` their own fields. Read back from a file it is input all the same: readers check
    each value they use."""

    seq: Required[int]  # the bundle's (the controller's own count: controller_seq)


@dataclass(frozen=True, slots=True)
class Bundle:
    source: str
    manifest: Manifest
    events: list[RecordedEvent]
    frames: dict[str, bytes] = field(repr=False)
    truncated: bool = False  # the last line was cut short (dropped)
    responses: bytes | None = field(repr=False, default=None)  # the recorded answers, whole flows only

    @property
    def actions(self) -> list[RecordedEvent]:
        return [e for e in self.events if e.get("event") == "action"]

    def frame(self, event: RecordedEvent) -> bytes | None:
        name = event.get("frame")
        return self.frames.get(name) if isinstance(name, str) else None


def _files(path: Path) -> Iterator[tuple[str, bytes]]:
    if path.is_dir():
        for item in sorted(path.rglob("*")):
            if item.is_file():
                yield item.relative_to(path).as_posix(), item.read_bytes()
        return
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if not n.endswith("/")]
            # A zip of the bundle's directory (what the gateway serves) or of its contents.
            prefix = ""
            if MANIFEST_FILE not in names:
                roots = {n.split("/", 1)[0] for n in names if "/" in n}
                prefix = f"{next(iter(roots))}/" if len(roots) == 1 else ""
            for name in names:
                if name.startswith(prefix):
                    yield name[len(prefix) :], archive.read(name)
    except zipfile.BadZipFile:
        raise BundleError(f"{path}: neither a directory nor a .zip file") from None


def read_bundle(path: Path) -> Bundle:
    if not path.exists():
        raise BundleError(f"{path}: no such file or directory")
    files = dict(_files(path))
    if MANIFEST_FILE not in files:
        raise BundleError(f"{path}: no {MANIFEST_FILE}; this is not a Corral recording")
    try:
        manifest = json.loads(files[MANIFEST_FILE])
    except ValueError as exc:
        raise BundleError(f"{path}: {MANIFEST_FILE} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: {MANIFEST_FILE} does not say format {FORMAT!r}; this is not a Corral recording")
    version = manifest.get("version")
    if version != VERSION:
        raise BundleError(f"{path}: recording format version {version!r}; this Corral reads version {VERSION}")
    viewport = manifest.get("viewport")
    if not (
        isinstance(viewport, dict)
        and isinstance(viewport.get("width"), int)
        and isinstance(viewport.get("height"), int)
    ):
        raise BundleError(f"{path}: {MANIFEST_FILE} has no viewport {{width, height}}")
    raw_lines = files.get(EVENTS_FILE, b"").split(b"\n")
    truncated = bool(raw_lines and raw_lines[-1].strip())  # no newline after the last line: cut short
    events: list[RecordedEvent] = []
    for number, line in enumerate(raw_lines[:-1] if truncated else raw_lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            raise BundleError(f"{path}: {EVENTS_FILE} line {number} is not valid JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("seq"), int) or "event" not in event:
            raise BundleError(f"{path}: {EVENTS_FILE} line {number} is not a recording event")
        if events and event["seq"] <= events[-1]["seq"]:
            raise BundleError(f"{path}: {EVENTS_FILE} line {number} is out of order (seq {event['seq']})")
        if event["event"] == "action":
            frame = event.get("frame")
            if frame is not None and not (isinstance(frame, str) and frame.startswith(f"{FRAMES_DIR}/")):
                raise BundleError(f"{path}: event {event['seq']} names a frame outside {FRAMES_DIR}/: {frame!r}")
            if not isinstance(event.get("native") or [], list):
                raise BundleError(f"{path}: event {event['seq']} has a 'native' that is not a list")
            if not isinstance(event.get("started") or 0, int | float):
                raise BundleError(f"{path}: event {event['seq']} has a 'started' that is not a time")
            if frame is not None and frame not in files:
                raise BundleError(f"{path}: event {event['seq']} names frame {frame}, which is missing")
        events.append(cast(RecordedEvent, event))  # checked above as far as a reader relies on it
    frames = {name: data for name, data in files.items() if name.startswith(f"{FRAMES_DIR}/")}
    responses = files.get(RESPONSES_FILE)
    if responses is not None:
        try:
            responses = responses[: check(responses).complete]  # a torn last flow is left out
        except ValueError as exc:
            raise BundleError(f"{path}: {RESPONSES_FILE} is {exc}") from None
    return Bundle(str(path), cast(Manifest, manifest), events, frames, truncated, responses)
