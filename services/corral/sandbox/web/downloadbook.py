"""The session's downloads as the controller keeps them: one record per download Chromium reported
(corral.sandbox.web.downloadwatch feeds it), the caps, who caused each one, and waits for one.

Pure state and asyncio waits: the watch turns Chromium's events into calls here, and does what a
call answers (cancel a download over a cap). Nothing Chromium says is taken as it comes: names are
made safe (corral.contracts.downloads.safe_name), URLs and counts bounded, a path believed only
when it is a file directly in the Downloads folder.
"""

from __future__ import annotations

import asyncio
import mimetypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from corral.contracts import downloads as dl
from corral.protocol.downloads import Download, DownloadCause, DownloadList

# A native action that ended this long ago still caused a download that begins now: Chromium reports
# the download on its own socket, after the navigation that made it already failed (Playwright's
# "Download is starting"), and a click's download begins after the click answered.
NATIVE_GRACE_S: Final = 5.0
# A CDP connection's command this recent caused it (a framework clicks, then waits for the event).
CDP_GRACE_S: Final = 10.0
_STATE_OF: Final = {"inProgress": "in_progress", "completed": "completed", "canceled": "canceled"}


@dataclass(frozen=True, slots=True)
class Cancel:
    """What the watch must do: cancel download ``id`` (it passed a cap: ``why``)."""

    id: str
    why: str


@dataclass(slots=True)
class _Act:
    cause: DownloadCause
    at: float  # monotonic; +inf while a native action runs


class Acts:
    """Who acts on the browser now: the native action running (the dispatcher says), the CDP
    connections' last commands (the relays say); :meth:`cause` names the likeliest cause of a
    download that begins now."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._native: _Act | None = None
        self._cdp: dict[str, _Act] = {}

    def native_started(self, action_id: str, action: str, actor: str | None = None) -> None:
        """A native action runs (``actor``: a person's ``human:<link id>``; None: the agent's)."""
        cause = DownloadCause(kind="action", action_id=action_id, action=action[:64], actor=actor)
        self._native = _Act(cause, float("inf"))

    def native_ended(self, action_id: str) -> None:
        if self._native is not None and self._native.cause.action_id == action_id:
            self._native.at = self._clock()

    def cdp_command(self, actor: str, window: str | None) -> None:
        """A CDP connection's command went to Chromium (``window``: its audit action id, if any)."""
        self._cdp[actor] = _Act(DownloadCause(kind="cdp", actor=actor[:64], action_id=window), self._clock())
        if len(self._cdp) > 64:  # connections come and go: the oldest word is forgotten
            del self._cdp[min(self._cdp, key=lambda key: self._cdp[key].at)]

    def cause(self) -> DownloadCause:
        now = self._clock()
        candidates: list[_Act] = []
        if self._native is not None and now - self._native.at <= NATIVE_GRACE_S:
            candidates.append(self._native)
        candidates += [act for act in self._cdp.values() if now - act.at <= CDP_GRACE_S]
        if not candidates:
            return DownloadCause(kind="browser")
        return max(candidates, key=lambda act: act.at).cause


class DownloadBook:
    """Every download of the session, in the order they began, bounded by :data:`~corral.contracts.
    downloads.MAX_DOWNLOADS` records (the oldest finished ones go) and by the caps: a download that
    passes ``max_file_bytes``, or takes the session past ``max_session_bytes``, is to be cancelled
    (:class:`Cancel`) and is marked ``capped``."""

    def __init__(
        self,
        max_file_bytes: int = dl.DEFAULT_MAX_FILE_BYTES,
        max_session_bytes: int = dl.DEFAULT_MAX_SESSION_BYTES,
        clock: Callable[[], float] = time.time,
        acts: Acts | None = None,
    ) -> None:
        self.max_file_bytes, self.max_session_bytes = max_file_bytes, max_session_bytes
        self._clock = clock
        self.acts = acts or Acts()
        self._records: dict[str, Download] = {}
        # The bytes of completed downloads whose records went (MAX_DOWNLOADS): their files stay in
        # ~/Downloads, so they still count against the session's cap (else a page that makes a
        # thousand small downloads frees the cap of its big ones and fills the disk past it).
        self._forgotten_bytes = 0
        self._changed = asyncio.Event()

    # -- what Chromium reports

    def began(self, guid: object, url: object, suggested: object) -> Download | Cancel | None:
        """``Browser.downloadWillBegin``: the new record, a :class:`Cancel` when the session is already
        at its cap (the record says so), or None for an event that names no download."""
        if not isinstance(guid, str) or dl.id_problem(guid) is not None or guid in self._records:
            return None
        shown = dl.safe_name(suggested if isinstance(suggested, str) else "")
        address = url if isinstance(url, str) else ""
        record = Download(
            id=guid,
            name=shown,
            url=address if len(address) <= dl.MAX_URL_CHARS else address[: dl.MAX_URL_CHARS] + "…",
            mime_type=mimetypes.guess_type(shown, strict=False)[0] or "application/octet-stream",
            state="in_progress",
            size=0,
            started_at=self._clock(),
            cause=self.acts.cause(),
        )
        self._keep(record)
        if self.total_bytes() >= self.max_session_bytes:
            return self._capped(guid, self._session_cap())
        return record

    def progressed(self, guid: object, received: object, total: object, state: object, path: object) -> Cancel | None:
        """``Browser.downloadProgress``: the record brought up to date; a :class:`Cancel` when it passed
        a cap. Events for an unknown or finished download change nothing."""
        record = self._records.get(guid) if isinstance(guid, str) else None
        if record is None or record.state in dl.FINISHED:
            return None
        size = _count(received, record.size)
        announced = _count(total, 0) or None
        new_state = _STATE_OF.get(state, "interrupted") if isinstance(state, str) else record.state
        name = dl.file_in_downloads(path)
        updated = replace_record(
            record,
            size=size,
            total_bytes=announced,
            state=new_state,
            path=f"{dl.DOWNLOADS_DIR}/{name}" if name is not None else record.path,
            name=dl.safe_name(name) if name is not None else record.name,
            finished_at=self._clock() if new_state in dl.FINISHED else None,
        )
        self._keep(updated)
        if new_state not in ("in_progress", "completed"):
            return None
        if max(size, announced or 0) > self.max_file_bytes:
            return self._capped(record.id, self._file_cap())
        if self.total_bytes() > self.max_session_bytes:
            return self._capped(record.id, self._session_cap())
        return None

    def interrupted(self, guid: str, why: str) -> None:
        """The watch could not follow it (Chromium restarted): it will never finish."""
        record = self._records.get(guid)
        if record is not None and record.state == "in_progress":
            self._keep(replace_record(record, state="interrupted", error=why[:512], finished_at=self._clock()))

    # -- what readers ask

    def get(self, download_id: str) -> Download | None:
        return self._records.get(download_id)

    def listing(self) -> DownloadList:
        return DownloadList(
            downloads=list(self._records.values()),
            total_bytes=self.total_bytes(),
            max_file_bytes=self.max_file_bytes,
            max_session_bytes=self.max_session_bytes,
        )

    def total_bytes(self) -> int:
        """The bytes the session's downloads hold: completed and in-progress ones (a cancelled or capped
        one's partial file is deleted by Chromium), those no longer listed included."""
        listed = sum(r.size for r in self._records.values() if r.state in ("completed", "in_progress"))
        return self._forgotten_bytes + listed

    async def wait_for(self, found: Callable[[Download], bool], timeout_s: float) -> Download | None:
        """The newest record ``found`` accepts, waiting up to ``timeout_s`` for one; None if none came."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            for record in reversed(self._records.values()):
                if found(record):
                    return record
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            changed = self._changed
            try:
                async with asyncio.timeout(left):
                    await changed.wait()
            except TimeoutError:
                return None

    # -- inside

    def _keep(self, record: Download) -> None:
        self._records[record.id] = record
        while len(self._records) > dl.MAX_DOWNLOADS:
            oldest = next((k for k, r in self._records.items() if r.state in dl.FINISHED), None)
            if oldest is None:
                break
            gone = self._records.pop(oldest)
            if gone.state == "completed":
                self._forgotten_bytes += gone.size
        # Waiters wake on the old event; the next wait takes the new one.
        self._changed.set()
        self._changed = asyncio.Event()

    def _capped(self, guid: str, why: str) -> Cancel:
        record = self._records[guid]
        self._keep(replace_record(record, state="capped", error=why, finished_at=self._clock()))
        return Cancel(guid, why)

    def _file_cap(self) -> str:
        return f"over the cap of {self.max_file_bytes} bytes per download (CORRAL_DOWNLOAD_MAX_FILE_MB)"

    def _session_cap(self) -> str:
        return f"over the session's cap of {self.max_session_bytes} bytes of downloads (CORRAL_DOWNLOAD_MAX_SESSION_MB)"


def replace_record(record: Download, **changes: object) -> Download:
    """``record`` with ``changes`` (validated again: a record is never out of its bounds)."""
    return Download.model_validate({**record.model_dump(), **changes})


def _count(value: object, otherwise: int) -> int:
    """A byte count from Chromium's event (a JSON number), or ``otherwise``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value > 1 << 53:
        return otherwise
    return int(value)


__all__ = ["CDP_GRACE_S", "NATIVE_GRACE_S", "Acts", "Cancel", "DownloadBook", "replace_record"]
