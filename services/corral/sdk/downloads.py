"""``sb.downloads``: what the session's browser downloaded, whoever made it (a native ``navigate`` or
click, a CDP client such as Playwright or Puppeteer, browser-use, a page on its own), listed and
fetched through the gateway (docs/downloads.md), in each twin.

Each call is one request of the gateway's HTTP API (:mod:`corral.gateway_client`) with the
sandbox's credential (the owner's key or the session's token); :meth:`Downloads.wait` asks again
every :data:`POLL_S` until a download that matches has ended.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from corral.errors import DownloadNotFound, DownloadWaitTimedOut, InvalidRequest
from corral.gateway_client import AsyncGateway, Gateway
from corral.gateway_client import Download as SavedFile
from corral.protocol.downloads import Download

POLL_S: Final = 0.25
DEFAULT_WAIT_S: Final = 30.0
_ENDED = frozenset({"completed", "canceled", "capped", "interrupted"})


def matches(record: Download, url: str | None, name: str | None, since: float | None) -> bool:
    """Whether ``record`` is the one asked for: its URL (exactly, or Playwright's ``download.url``),
    its name (the file's in ``~/Downloads``, or Playwright's ``suggested_filename``, which Chromium may
    have made unique: ``report (1).pdf`` matches ``report.pdf``), begun at ``since`` or later."""
    if url is not None and record.url != url:
        return False
    if since is not None and record.started_at < since:
        return False
    if name is None:
        return True
    stem, dot, ext = name.rpartition(".")
    uniqued = record.name.startswith(f"{stem or name} (") and record.name.endswith(f"){dot}{ext}" if dot else ")")
    return record.name == name or uniqued


def _newest_ended(records: list[Download], url: str | None, name: str | None, since: float | None) -> Download | None:
    for record in reversed(records):
        if record.state in _ENDED and matches(record, url, name, since):
            return record
    return None


def _no_filter(url: str | None, name: str | None, since: float | None) -> None:
    if url is None and name is None and since is None:
        raise InvalidRequest("wait for a download by url=, name= or since= (time.time() before the click)", "url")


class Downloads:
    """``sb.downloads``: the session's browser downloads (the owner's key or the session's token)."""

    def __init__(self, gateway: Gateway, session_id: str) -> None:
        self._gateway = gateway
        self._id = session_id

    def list(self) -> list[Download]:
        """Every download of the session, oldest first: id, name, size, MIME type, URL, state, when,
        and what caused it (``cause.kind``: ``action``, ``cdp`` or ``browser``)."""
        return self._gateway.downloads(self._id).downloads

    def get(self, download_id: str) -> Download:
        """One download's record (``no_such_download``, 404, for an id the session has not)."""
        for record in self.list():
            if record.id == download_id:
                return record
        raise DownloadNotFound(f"no download {download_id!r} in session {self._id}")

    def read(self, download_id: str) -> bytes:
        """A completed download's bytes, whole (``save`` streams a large one to a file)."""
        return self._gateway.download_bytes(self._id, download_id)

    def save(self, download_id: str, path: str | Path) -> SavedFile:
        """A completed download's bytes streamed to ``path`` (which appears only once whole)."""
        return self._gateway.save_download(self._id, download_id, path)

    def wait(
        self,
        *,
        url: str | None = None,
        name: str | None = None,
        since: float | None = None,
        timeout_s: float = DEFAULT_WAIT_S,
    ) -> Download:
        """The newest download that matches (see :func:`matches`) once it ended (``completed``, or
        ``canceled``/``capped``/``interrupted``: its ``state`` and ``error`` say); DownloadWaitTimedOut after
        ``timeout_s``. With Playwright: ``sb.downloads.wait(url=download.url)``."""
        _no_filter(url, name, since)
        deadline = time.monotonic() + timeout_s
        while True:
            found = _newest_ended(self.list(), url, name, since)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                raise DownloadWaitTimedOut(f"no download matching url={url!r} name={name!r} ended within {timeout_s} s")
            time.sleep(POLL_S)


class AsyncDownloads:
    """The async twin of :class:`Downloads`."""

    def __init__(self, gateway: AsyncGateway, session_id: str) -> None:
        self._gateway = gateway
        self._id = session_id

    async def list(self) -> list[Download]:
        """Every download of the session, oldest first (see :meth:`Downloads.list`)."""
        return (await self._gateway.downloads(self._id)).downloads

    async def get(self, download_id: str) -> Download:
        """One download's record."""
        for record in await self.list():
            if record.id == download_id:
                return record
        raise DownloadNotFound(f"no download {download_id!r} in session {self._id}")

    async def read(self, download_id: str) -> bytes:
        """A completed download's bytes, whole."""
        return await self._gateway.download_bytes(self._id, download_id)

    async def save(self, download_id: str, path: str | Path) -> SavedFile:
        """A completed download's bytes streamed to ``path``."""
        return await self._gateway.save_download(self._id, download_id, path)

    async def wait(
        self,
        *,
        url: str | None = None,
        name: str | None = None,
        since: float | None = None,
        timeout_s: float = DEFAULT_WAIT_S,
    ) -> Download:
        """The newest matching download once it ended (see :meth:`Downloads.wait`)."""
        _no_filter(url, name, since)
        deadline = time.monotonic() + timeout_s
        while True:
            found = _newest_ended(await self.list(), url, name, since)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                raise DownloadWaitTimedOut(f"no download matching url={url!r} name={name!r} ended within {timeout_s} s")
            await asyncio.sleep(POLL_S)


__all__ = ["POLL_S", "AsyncDownloads", "Downloads", "matches"]
