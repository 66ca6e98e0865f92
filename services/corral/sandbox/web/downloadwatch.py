"""The controller's own watch on Chromium's downloads: one CDP connection to the browser, kept open
(made again after Chromium restarts), with download events on and the behaviour Chromium's policy
gives (``default``: saved in ``~/Downloads`` under the name the server gave, made unique).

Chromium sends ``Browser.downloadWillBegin`` and ``Browser.downloadProgress`` to every session that
turned events on, whoever started the download: the native actions' Playwright, a CDP client (whose
own ``setDownloadBehavior`` the relay rewrites to the same place: corral.sandbox.web.cdpturn), a
page on its own. Each event goes to the :class:`~corral.sandbox.web.downloadbook.DownloadBook`; what
it answers (a cancel for a download over a cap) is sent here. Begun and ended downloads are recorded
(``download`` events) and audited (corral.contracts.control.DownloadEvent, through the reporter).

Started in the background after the controller serves (a cold start waits for none of it); the
websockets client is imported then.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Final

from corral.contracts.control import DownloadEvent
from corral.errors import ActionError
from corral.protocol.downloads import Download
from corral.sandbox.egress import ActionReporter
from corral.sandbox.recorder import Recorder
from corral.sandbox.web import cdp
from corral.sandbox.web.downloadbook import Cancel, DownloadBook

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)

RETRY_S: Final = 1.0  # between attempts to reach Chromium (booting, restarting)
MAX_EVENT_BYTES: Final = 1 << 20  # the browser session gets small events only: a bigger frame ends it
_CALL_TIMEOUT_S: Final = 5.0
_WATCH = {"behavior": "default", "eventsEnabled": True}


class DownloadWatch:
    """The watch's task (:meth:`start`, :meth:`close`) and its connection's calls."""

    def __init__(
        self,
        cdp_url: str,
        book: DownloadBook,
        reporter: ActionReporter | None,
        recorder: Recorder | None,
        retry_s: float = RETRY_S,
    ) -> None:
        self._cdp_url, self._book, self._reporter, self._recorder = cdp_url, book, reporter, recorder
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()
        self._calls: dict[int, asyncio.Future[dict[str, object]]] = {}
        self._next_id = 0
        self.watching = asyncio.Event()  # set while events are on (tests, readiness)
        self._reached = False  # Chromium was reached once: a loss from now on is worth a warning

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._reports) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        while True:
            try:
                await self._follow()
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed, ActionError, ValueError) as exc:
                if self._reached:  # at boot Chromium is not up yet: quiet until it was reached once
                    log.warning("the downloads watch lost Chromium (%r); trying again", exc)
            except Exception:  # a bug must not end the watch for the session's life
                log.exception("the downloads watch failed; trying again")
            self.watching.clear()
            if self._reached:
                for record in self._book.listing().downloads:
                    if record.state == "in_progress":
                        self._book.interrupted(record.id, "Chromium restarted before the download ended")
            await asyncio.sleep(self._retry_s)

    async def _follow(self) -> None:
        from websockets.asyncio.client import connect

        url = await cdp.upstream_url(self._cdp_url, None)
        async with connect(url, compression=None, max_size=MAX_EVENT_BYTES, ping_interval=None, open_timeout=10) as ws:
            reader = asyncio.create_task(self._read(ws))
            try:
                await self._call(ws, "Browser.setDownloadBehavior", _WATCH)
                self.watching.set()
                self._reached = True
                await reader
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                for pending in self._calls.values():
                    pending.cancel()
                self._calls.clear()

    async def _read(self, ws: ClientConnection) -> None:
        async for frame in ws:
            try:
                message = json.loads(frame)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            call_id = message.get("id")
            answered = self._calls.pop(call_id, None) if isinstance(call_id, int) else None
            if answered is not None and not answered.done():
                answered.set_result(message)
                continue
            params = message.get("params")
            if isinstance(params, dict):
                self._event(ws, message.get("method"), params)

    def _keep(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(work)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    def _event(self, ws: ClientConnection, method: object, params: dict[str, object]) -> None:
        if method == "Browser.downloadWillBegin":
            began = self._book.began(params.get("guid"), params.get("url"), params.get("suggestedFilename"))
            if isinstance(began, Download):
                self._report("started", began)
            elif isinstance(began, Cancel):
                self._keep(self._cancel(ws, began))
        elif method == "Browser.downloadProgress":
            before = self._book.get(str(params.get("guid")))
            cancel = self._book.progressed(
                params.get("guid"),
                params.get("receivedBytes"),
                params.get("totalBytes"),
                params.get("state"),
                params.get("filePath"),
            )
            if cancel is not None:
                self._keep(self._cancel(ws, cancel))  # its answer is read by this very loop: not awaited here
                return
            after = self._book.get(str(params.get("guid")))
            if before is not None and after is not None and after.state != before.state:
                self._report(after.state, after)

    async def _cancel(self, ws: ClientConnection, cancel: Cancel) -> None:
        """Chromium told to stop ``cancel.id`` (it deletes the partial file): in the default context,
        else in each context there is (the event names none)."""
        log.warning("cancelled download %s: %s", cancel.id, cancel.why)
        record = self._book.get(cancel.id)
        if record is not None:
            self._report("capped", record)
        answer = await self._call(ws, "Browser.cancelDownload", {"guid": cancel.id})
        if "error" not in answer:
            return
        contexts = (await self._call(ws, "Target.getBrowserContexts", {})).get("result")
        ids = contexts.get("browserContextIds") if isinstance(contexts, dict) else None
        for context in ids if isinstance(ids, list) else []:
            if isinstance(context, str):
                await self._call(ws, "Browser.cancelDownload", {"guid": cancel.id, "browserContextId": context})

    async def _call(self, ws: ClientConnection, method: str, params: dict[str, object]) -> dict[str, object]:
        """One command on the watch's socket and its answer (an ``error`` one when none came in time);
        never called from the reading loop, which reads the answer."""
        self._next_id += 1
        call_id = self._next_id
        waiting: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = waiting
        try:
            await ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
            async with asyncio.timeout(_CALL_TIMEOUT_S):
                return await waiting
        except TimeoutError:
            return {"error": {"message": f"{method} got no answer"}}
        finally:
            self._calls.pop(call_id, None)

    def _report(self, change: str, record: Download) -> None:
        """``download`` in the recording and the audit (a kept task: a download never waits on either)."""
        cause = record.cause
        actor = cause.actor or ("agent" if cause.kind == "action" else "browser")
        if self._recorder is not None:
            self._recorder.note(
                {"event": "download", "change": change, "download": record.id, "name": record.name, "size": record.size}
                | {"url": record.url, "cause": cause.model_dump(exclude_none=True)}
            )
        if self._reporter is None:
            return
        event = DownloadEvent(change, record.id, record.name, record.url[:4096], record.size, actor, cause.action_id)
        self._keep(self._reporter.download_changed(event))


__all__ = ["DownloadWatch"]
