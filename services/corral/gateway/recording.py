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
import io
import json
import logging
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx

from corral.gateway.store import session_dir
from corral.recording.bundle import EVENTS_FILE, FORMAT, FRAMES_DIR, MANIFEST_FILE, VERSION

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
    def __init__(self, directory: Path, base_url: str, audit: Path | None, http: httpx.AsyncClient) -> None:
        self.directory = directory
        self._base_url = base_url
        self._audit = AuditIndex(audit)
        self._http = http
        self._after = 0
        self._written = 0
        self._controller_last = 0
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
                    self._after = max(self._after, int(event.get("controller_seq", 0)))
                    self._written = max(self._written, int(event["seq"]))
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self._fetch(POLL_WAIT_MS)
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("recording fetch for %s failed: %s", self.directory.name, exc)
                await asyncio.sleep(0.5)
            except Exception:  # disk full, a pruned directory, a malformed event: say so, keep going
                log.exception("recording %s: could not write an event", self.directory.name)
                await asyncio.sleep(1)

    async def _fetch(self, wait_ms: int) -> None:
        response = await self._http.get(
            f"{self._base_url}/v1/recording",
            params={"after": self._after, "wait_ms": wait_ms},
            timeout=wait_ms / 1000 + 2,
        )
        if response.status_code == 404:
            await asyncio.sleep(5)  # this controller does not record
            return
        response.raise_for_status()
        body = response.json()
        self._controller_last = int(body.get("last", 0))
        if int(body.get("last", 0)) < self._after:
            self._write({"event": "controller_restarted"})  # its numbering starts again
            self._after = 0
            return
        if body.get("events") and int(body.get("oldest", 1)) > self._after + 1:
            self._write({"event": "gap", "lost": int(body["oldest"]) - self._after - 1})
        for event in body.get("events", []):
            seq = int(event["seq"])
            self._write_action(event)
            self._after = seq  # only once written: a failed write is fetched again

    def _write_action(self, event: dict[str, Any]) -> None:
        frame_b64 = event.pop("frame_webp", None)
        controller_seq = event.pop("seq")
        seq = self._written + 1
        frame = None
        if frame_b64:
            frame = f"{FRAMES_DIR}/{seq:06d}.webp"
            (self.directory / frame).write_bytes(base64.b64decode(frame_b64))
        self._write(
            {
                "event": "action",
                "controller_seq": controller_seq,
                **event,
                "frame": frame,
                "audit": self._audit.seqs(event.get("action_id")),
            }
        )

    def _write(self, event: dict[str, Any]) -> None:
        self._written += 1
        line = json.dumps({"seq": self._written, "time": time.time(), **event}, separators=(",", ":")) + "\n"
        fd = os.open(self.directory / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode())  # one write per event: a kill never leaves half of one
        finally:
            os.close(fd)

    async def stop(self, reason: str) -> None:
        """Take what the controller still holds, then close the bundle."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # The last frames may still be settling in the controller: wait for them, briefly.
        deadline = time.monotonic() + DRAIN_S
        with contextlib.suppress(httpx.HTTPError, ValueError, OSError):
            await self._fetch(0)
            while self._after < self._controller_last and time.monotonic() < deadline:
                await self._fetch(int(max(0.0, deadline - time.monotonic()) * 1000))
        manifest_path = self.directory / MANIFEST_FILE
        with contextlib.suppress(OSError, ValueError):
            manifest = json.loads(manifest_path.read_text())
            manifest.update(ended_at=time.time(), end_reason=reason, events=self._written)
            _atomic_json(manifest_path, manifest)


class RecordingManager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._live: dict[str, SessionRecorder] = {}

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
    ) -> None:
        recorder = SessionRecorder(self.directory(session_id), base_url, audit, http)
        recorder.start({"session": session_id, **manifest}, owner)
        self._live[session_id] = recorder

    async def stop(self, session_id: str, reason: str) -> None:
        recorder = self._live.pop(session_id, None)
        if recorder is not None:
            await recorder.stop(reason)

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

    def events(self, session_id: str) -> list[dict[str, Any]]:
        """The bundle's events so far (for the viewer); a torn last line is left out."""
        path = self.directory(session_id) / EVENTS_FILE
        out = []
        for line in path.read_bytes().split(b"\n") if path.exists() else []:
            with contextlib.suppress(ValueError):
                if line.strip():
                    out.append(json.loads(line))
        return out

    def frame(self, session_id: str, name: str) -> bytes:
        """One frame by its file name (``000001.webp``); raises ValueError for anything else."""
        if not (name.endswith(".webp") and name[:-5].isdigit()):
            raise ValueError(f"not a frame name: {name!r}")
        return (self.directory(session_id) / FRAMES_DIR / name).read_bytes()

    def zip(self, session_id: str) -> bytes:
        """The bundle as a .zip (the owner note left out), readable even mid-session."""
        directory = self.directory(session_id)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted(directory.rglob("*")):
                if path.is_file() and path.name != OWNER_FILE and path.suffix != ".tmp":
                    bundle.write(path, f"{session_id}/{path.relative_to(directory)}")
        return buffer.getvalue()

    def prune(self, retention_s: float) -> int:
        removed, cutoff = 0, time.time() - retention_s
        for path in self.root.glob(f"ses_*/{MANIFEST_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                ended = json.loads(path.read_text()).get("ended_at")
                if ended and ended < cutoff and path.parent.name not in self._live:
                    shutil.rmtree(path.parent, ignore_errors=True)
                    removed += 1
        return removed
