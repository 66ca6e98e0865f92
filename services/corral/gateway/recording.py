"""Session recordings, written by the gateway as the session goes (format: docs/recording.md).

One task per live session long-polls its controller for recorded events and appends them to
``<data_dir>/recordings/<session>/``: ``manifest.json``, ``events.jsonl`` (one line per request,
flushed as written) and ``frames/<seq>.webp``. A session killed mid-way leaves a bundle that is
readable up to its last written event. Each event also lists the audit-log records its action
caused (by ``action_id``) as far as the proxy had written them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import mmap
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import IO, Any

import httpx

from corral.errors import UnprovenController
from corral.gateway import controller
from corral.gateway.store import session_dir
from corral.proxy.flowfile import check
from corral.recording.bundle import EVENTS_FILE, FORMAT, FRAMES_DIR, MANIFEST_FILE, RESPONSES_FILE, VERSION

log = logging.getLogger(__name__)

OWNER_FILE = ".owner"  # the gateway's own note of who may read it; never part of a download
POLL_WAIT_MS = 10_000
DRAIN_S = 3.0  # at the end, how long to wait for frames the controller is still settling


def _atomic_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


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
            for line in log_file:
                if not line.endswith(b"\n"):
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
    ) -> None:
        self.directory = directory
        self._base_url = base_url
        self._secret = secret  # the controller's per-boot secret: requests are signed, answers proven
        self._audit = AuditIndex(audit)
        self._http = http
        self._after = 0
        self._written = 0
        self._controller_last = 0
        self._writing: asyncio.Future[None] | None = None
        self._boot: str | None = None  # the controller run whose numbering ``_after`` follows
        self._task: asyncio.Task[None] | None = None

    def start(self, manifest: dict[str, Any], owner: str) -> None:
        (self.directory / FRAMES_DIR).mkdir(parents=True, exist_ok=True)
        if not (self.directory / MANIFEST_FILE).exists():
            _atomic_json(self.directory / MANIFEST_FILE, {"format": FORMAT, "version": VERSION, **manifest})
            (self.directory / OWNER_FILE).write_text(owner)
        events = self.directory / EVENTS_FILE
        if events.exists():  # a restarted gateway carries on where it stopped
            for line in events.read_bytes().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    event = json.loads(line)
                    self._written = max(self._written, int(event["seq"]))
                    if event.get("event") == "controller_restarted":
                        self._after, self._boot = 0, event.get("controller_boot")
                    elif event.get("event") == "action":
                        if event.get("controller_boot") != self._boot:
                            self._after = 0  # a new controller run: its numbering starts again
                        self._boot = event.get("controller_boot")
                        self._after = max(self._after, int(event.get("controller_seq", 0)))
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self._fetch(POLL_WAIT_MS)
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, UnprovenController) as exc:
                log.debug("recording fetch for %s failed: %s", self.directory.name, exc)
                await asyncio.sleep(0.5)
            except Exception:  # disk full, a pruned directory, a malformed event: say so, keep going
                log.exception("recording %s: could not write an event", self.directory.name)
                await asyncio.sleep(1)

    async def _fetch(self, wait_ms: int) -> None:
        response = await controller.request(
            self._http,
            self._base_url,
            self._secret,
            "GET",
            "/v1/recording",
            params={"after": self._after, "wait_ms": wait_ms},
            timeout=wait_ms / 1000 + 2,
        )
        if response.status_code == 404:
            await asyncio.sleep(5)  # this controller does not record
            return
        response.raise_for_status()
        body = response.json()
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
            # File writes off the event loop; shielded, so a cancelled task never leaves an event
            # written but not counted (it would be fetched and written again).
            self._writing = asyncio.ensure_future(asyncio.to_thread(self._write_action, event))
            await asyncio.shield(self._writing)

    def _write_action(self, event: dict[str, Any]) -> None:
        frame_b64 = event.pop("frame_webp", None)
        controller_seq = int(event.pop("seq"))
        seq = self._written + 1
        frame = None
        if frame_b64:
            frame = f"{FRAMES_DIR}/{seq:06d}.webp"
            (self.directory / frame).write_bytes(base64.b64decode(frame_b64))
        self._write(
            {
                "event": "action",
                "controller_seq": controller_seq,
                "controller_boot": self._boot,
                **event,
                "frame": frame,
                "audit": self._audit.seqs(event.get("action_id")),
            }
        )
        self._after = controller_seq  # only once written: a failed write is fetched again

    def _write(self, event: dict[str, Any]) -> None:
        self._written += 1
        line = json.dumps({"seq": self._written, "time": time.time(), **event}, separators=(",", ":")) + "\n"
        fd = os.open(self.directory / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode())  # one write per event: a kill never leaves half of one
        finally:
            os.close(fd)

    async def stop(self, reason: str, drain_s: float = DRAIN_S) -> None:
        """Take what the controller still holds (for up to ``drain_s``), then close the bundle."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)  # an event being written
        try:
            # The last frames may still be settling in the controller: wait for them, briefly.
            async with asyncio.timeout(drain_s):
                deadline = time.monotonic() + drain_s
                await self._fetch(0)
                while self._after < self._controller_last:
                    await self._fetch(int(max(0.0, deadline - time.monotonic()) * 1000))
        except (TimeoutError, httpx.HTTPError, ValueError, OSError, UnprovenController) as exc:
            log.info("recording %s: stopped draining (%s)", self.directory.name, type(exc).__name__)
        finally:
            if self._writing is not None:
                # The event being written lands before the manifest says ended (ended means complete).
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(self._writing), 5.0)
            # Closed whatever happened above, even when cancelled: an ended session's bundle says so.
            close_manifest(self.directory, reason, self._written)


def close_manifest(directory: Path, reason: str, events: int | None = None) -> None:
    manifest_path = directory / MANIFEST_FILE
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("ended_at"):
            return
        if events is None:
            events_path = directory / EVENTS_FILE
            events = len(events_path.read_bytes().splitlines()) if events_path.exists() else 0
        manifest.update(ended_at=time.time(), end_reason=reason, events=events)
        _atomic_json(manifest_path, manifest)


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
    def __init__(self, root: Path) -> None:
        self.root = root
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
        secret: str = "",
    ) -> None:
        recorder = SessionRecorder(self.directory(session_id), base_url, audit, http, secret)
        recorder.start({"session": session_id, **manifest}, owner)
        self._live[session_id] = recorder
        if responses is not None:
            self._pending_responses[session_id] = responses

    async def stop(self, session_id: str, reason: str, drain_s: float = DRAIN_S) -> None:
        recorder = self._live.pop(session_id, None)
        if recorder is not None:
            await recorder.stop(reason, drain_s)

    def close_ended(self, session_id: str, reason: str, responses: Path | None) -> None:
        """A session that ended unseen (lost while the gateway was down): close its bundle."""
        directory = self.directory(session_id)
        if not (directory / MANIFEST_FILE).exists():
            return
        close_manifest(directory, reason)
        if responses is not None:
            self.attach_responses(session_id, responses)

    def attach_responses(self, session_id: str, responses: Path) -> None:
        """The ended session's recorded responses move into its bundle (its proxy is gone: complete)."""
        directory = self.directory(session_id)
        self._pending_responses.pop(session_id, None)
        complete = _complete_length(responses)
        if complete is None or not directory.exists():
            return
        tmp = directory / f"{RESPONSES_FILE}.tmp"
        with responses.open("rb") as source, tmp.open("wb") as out:
            _copy(source, out, complete)  # streamed: the file can be hundreds of MB
        os.replace(tmp, directory / RESPONSES_FILE)
        responses.unlink(missing_ok=True)  # one copy, in the bundle

    async def stop_all(self) -> None:
        """Gateway shutdown: the sessions go on, so the bundles stay open (a restart continues them)."""
        for recorder in list(self._live.values()):
            if recorder._task is not None:
                recorder._task.cancel()
        await asyncio.gather(*(r._task for r in self._live.values() if r._task), return_exceptions=True)
        self._live.clear()

    def owner(self, session_id: str) -> str | None:
        try:
            return (self.directory(session_id) / OWNER_FILE).read_text().strip()
        except (OSError, ValueError):
            return None

    def listing(self, owner: str) -> list[dict[str, Any]]:
        out = []
        for path in self.root.glob(f"ses_*/{MANIFEST_FILE}"):
            if self.owner(path.parent.name) != owner:
                continue
            with contextlib.suppress(OSError, ValueError):
                manifest = json.loads(path.read_text())
                events = path.parent / EVENTS_FILE
                count = sum(1 for line in events.read_bytes().splitlines() if line.strip()) if events.exists() else 0
                out.append(
                    {
                        "session": path.parent.name,
                        "state": "live" if path.parent.name in self._live else "ended",
                        "created_at": manifest.get("created_at"),
                        "ended_at": manifest.get("ended_at"),
                        "events": count,
                    }
                )
        return sorted(out, key=lambda item: item.get("created_at") or 0, reverse=True)

    def events(self, session_id: str, after: int = 0) -> dict[str, Any]:
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
        path = directory / EVENTS_FILE
        out = []
        for line in path.read_bytes().split(b"\n") if path.exists() else []:
            if not line.strip():
                continue
            # Every line starts with its seq (the recorder writes it first): skip old ones unparsed.
            head = line[7 : line.find(b",", 7)] if line.startswith(b'{"seq":') else b""
            if head.isdigit() and int(head) <= after:
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and isinstance(event.get("seq"), int) and event["seq"] > after:
                    out.append(event)
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
                if path.is_file() and path.name != OWNER_FILE and path.suffix != ".tmp":
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
        removed, cutoff = 0, time.time() - retention_s
        for path in self.root.glob(f"ses_*/{MANIFEST_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                ended = json.loads(path.read_text()).get("ended_at")
                if ended and ended < cutoff and path.parent.name not in self._live:
                    shutil.rmtree(path.parent, ignore_errors=True)
                    removed += 1
        return removed
