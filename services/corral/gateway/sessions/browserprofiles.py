"""Browser profiles on the session side: a saved profile loaded into a session's browser at its create,
saved from it on request or at its end, each load and save an audit record (name and size) in the
session's egress chain.

:meth:`BrowserProfiles.export_state` and :meth:`BrowserProfiles.import_state` are the seam for whatever
else moves a browser's state (pause and resume): bytes out of a running sandbox, bytes into one, through
the runtime (corral.runtime.SandboxRuntime's ``export_browser_state``/``import_browser_state``), with
the browser ready again when they return; neither stores nor audits anything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from corral.contracts.control import ProfileEvent
from corral.errors import EgressUnavailable, ProfileNotFound
from corral.gateway import auth
from corral.gateway.models import ProfileRef
from corral.gateway.profiles import ProfileInfo, ProfileStore, pack_state, unpack_state
from corral.gateway.sessions import browsercookies
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import Pair, Session
from corral.runtime import SandboxAddress, SandboxRuntime

log = logging.getLogger(__name__)

READY_S = 30.0  # the controller sees Chromium again within this after an import or export
MOVE_S = 60.0  # one export or import, Chromium's stop and start included


class BrowserProfiles:
    def __init__(self, store: ProfileStore, runtime: SandboxRuntime, egress: EgressPort) -> None:
        self.store, self._runtime, self._egress = store, runtime, egress

    # -- the seam: a sandbox's browser state as bytes ---------------------------------------------------

    async def export_state(self, sandbox: SandboxAddress, max_bytes: int | None = None) -> bytes:
        """The browser's cookies (read over CDP while it runs) and its local storage and IndexedDB
        (archived by the sandbox with Chromium stopped, started again with its cookies set back and
        answering when this returns), as one value (``profiles.pack_state``)."""
        cap = self.store.max_bytes if max_bytes is None else max_bytes
        started = time.monotonic()
        cookies = await browsercookies.read_cookies(sandbox, cap)
        read = time.monotonic()
        try:
            archive = await asyncio.to_thread(self._runtime.export_browser_state, sandbox.id, cap, MOVE_S)
        except BaseException:
            # Over the cap, or refused: Chromium was stopped all the same; the session gets it back whole.
            with contextlib.suppress(Exception):
                await self._back(sandbox, cookies)
            raise
        exported = time.monotonic()
        await self._back(sandbox, cookies)
        log.info(
            "browser state of %s: cookies read in %.2fs, files archived in %.2fs, browser back %.2fs later",
            sandbox.name,
            read - started,
            exported - read,
            time.monotonic() - exported,
        )
        return pack_state(archive, cookies)

    async def _back(self, sandbox: SandboxAddress, cookies: bytes) -> None:
        """After an export: the browser answering again, with the cookies it had (the restarted one
        has only what its store had written)."""
        await asyncio.to_thread(self._runtime.wait_ready, sandbox, READY_S)
        await browsercookies.write_cookies(sandbox, cookies)

    async def import_state(self, sandbox: SandboxAddress, state: bytes, max_bytes: int | None = None) -> int:
        """:meth:`export_state`'s value into a running sandbox: the archive checked and unpacked by the
        sandbox, its browser restarted onto it, then its cookies set over CDP; answering when this
        returns. The bytes of files put in place."""
        cap = self.store.max_bytes if max_bytes is None else max_bytes
        archive, cookies = unpack_state(state)
        started = time.monotonic()
        written = await asyncio.to_thread(self._runtime.import_browser_state, sandbox.id, archive, cap, MOVE_S)
        swapped = time.monotonic()
        await asyncio.to_thread(self._runtime.wait_ready, sandbox, READY_S)
        ready = time.monotonic()
        count = await browsercookies.write_cookies(sandbox, cookies)
        log.info(
            "browser state into %s: files swapped in %.2fs, browser ready %.2fs later, %d cookies set in %.2fs",
            sandbox.name,
            swapped - started,
            ready - swapped,
            count,
            time.monotonic() - ready,
        )
        return written

    # -- saved profiles ---------------------------------------------------------------------------------

    def prepare(self, owner: str, ref: ProfileRef | None) -> bytes | None:
        """At a create, before anything starts: the archive to load; None for no profile, or one that
        ``save`` will make at the session's first save. ProfilesOff without a profile key, 404 naming
        a missing profile the request does not save."""
        if ref is None:
            return None
        self.store.require()
        try:
            return self.store.load(owner, ref.name)
        except ProfileNotFound:
            if ref.save:
                return None
            raise

    async def load(self, pair: Pair, ref: ProfileRef, archive: bytes) -> None:
        """The saved archive into the claimed pair's browser, then its audit record (a pair whose
        record the proxy did not take is not handed out: the caller removes it)."""
        try:
            await self.import_state(pair.sandbox, archive)
        except Exception:
            await self._report_quietly(pair, ProfileEvent("failed", ref.name, len(archive), auth.OWNER_ACTOR))
            raise
        if pair.egress is not None:
            await self._egress.report(pair.egress, ProfileEvent("loaded", ref.name, len(archive), auth.OWNER_ACTOR))

    async def save(self, session: Session, actor: str = auth.OWNER_ACTOR, state: bytes | None = None) -> ProfileInfo:
        """The session's browser state saved under its profile's name (the previous version kept when
        this fails, and whatever fails reported to the audit chain); ``state``: that state already
        exported (a paused session's, whose sandbox is gone), else exported from its sandbox now."""
        ref = session.record.profile
        if ref is None:
            raise ProfileNotFound(f"session {session.id} was not created with a profile")
        self.store.require()
        pair = Pair(session.id, session.sandbox, session.egress)
        try:
            archive = state if state is not None else await self.export_state(session.sandbox)
            info = await asyncio.to_thread(self.store.save, session.record.owner, ref.name, archive)
        except Exception:
            await self._report_quietly(pair, ProfileEvent("failed", ref.name, 0, actor))
            raise
        await self._report_quietly(pair, ProfileEvent("saved", ref.name, info.size, actor))
        return info

    async def save_at_end(self, session: Session, paused_state: bytes | None = None) -> None:
        """At a session's end, before its sandbox goes: saved when the session asked for it (a paused
        one's from the state its pause exported, ``paused_state``); a failure is logged (and
        audited), never in the way of the end."""
        ref = session.record.profile
        if ref is None or not ref.save or not self.store.enabled:
            return
        if session.record.paused is not None and paused_state is None:
            log.warning(
                "session %s: profile %r not saved at its end: its paused browser state is gone", session.id, ref.name
            )
            return
        try:
            info = await self.save(session, state=paused_state)
        except Exception as exc:
            log.warning("session %s: profile %r not saved at its end: %s", session.id, ref.name, exc)
            return
        log.info("session %s: profile %r saved at its end (%d bytes)", session.id, ref.name, info.size)

    async def _report_quietly(self, pair: Pair, event: ProfileEvent) -> None:
        if pair.egress is None:
            return
        try:
            await self._egress.report(pair.egress, event)
        except EgressUnavailable as exc:
            log.warning("session %s: the profile's %s record was not taken: %s", pair.session_id, event.change, exc)
