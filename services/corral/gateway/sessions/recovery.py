"""A starting gateway's look at what the last one left: it adopts the sessions whose sandboxes still
run, closes the ones that died meanwhile, and removes what nobody owns (sandboxes, pooled pairs, egress
pairs, session networks and their host guards)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import SANDBOX_EXITED, Session, SessionRecord, end_reason_of
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Specs, Starts
from corral.gateway.volumes import Volumes
from corral.runtime import SandboxAddress, SandboxInfo, SandboxRuntime

log = logging.getLogger(__name__)


class Recovery:
    def __init__(
        self,
        book: SessionBook,
        runtime: SandboxRuntime,
        specs: Specs,
        starts: Starts,
        egress: EgressPort,
        recordings: SessionRecordings,
        volumes: Volumes | None = None,
    ) -> None:
        self._book, self._runtime, self._specs, self._starts = book, runtime, specs, starts
        self._egress, self._recordings, self._volumes = egress, recordings, volumes

    async def run(self) -> None:
        await self._recover()
        if self._volumes is not None:  # after the unowned sandboxes went: only adopted ones use a mount
            await self._volumes.recover({s.id for s in self._book.sessions()})
        await self._remove_orphan_networks()
        # Host guards of networks that went while no gateway watched (a crash, a kill).
        stale = await asyncio.to_thread(self._runtime.remove_stale_guards)
        if stale:
            log.info("removed the host guard of %d networks that are gone", len(stale))

    async def _recover(self) -> None:
        """Adopt the sessions whose containers still run; remove containers nobody owns."""
        infos = await asyncio.to_thread(self._runtime.list_sandboxes, self._specs.instance_labels())
        alive = {info.id: info for info in infos if info.running and info.address is not None}
        claimed: set[str] = set()
        for record in self._book.stored_records():
            if record.paused is not None:  # paused: no sandbox; its proxy stopped, kept
                self._book.add(
                    Session(record, SandboxAddress(record.container, record.container, "", 0), state="paused")
                )
                if record.egress is not None:
                    self._egress.vault.adopt(record.id, record.secrets)  # values gone: a resume asks for them
                continue
            info = alive.get(record.container)
            if info is None or info.address is None:
                await self._lost(record)
                continue
            self._book.add(Session(record, info.address))
            claimed.add(info.id)
            if record.egress is not None:
                self._egress.vault.adopt(record.id, record.secrets)  # the values are gone with the last gateway
        await self._starts.remove_unowned({s.egress.session_id for s in self._book.sessions() if s.egress is not None})
        await self._remove_unclaimed(infos, claimed)
        log.info("recovered %d sessions (pooled sandboxes are never adopted)", len(self._book))

    async def _lost(self, record: SessionRecord) -> None:
        """Its sandbox died while the gateway was down: the log is kept, as ended (``lost``, or
        ``node_lost`` / ``node_drained`` when its machine went: the runtime says so)."""
        reason = await self._lost_reason(record.container)
        if record.egress is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._egress.teardown_blocking, record.egress)
            with contextlib.suppress(OSError, ValueError):
                self._egress.write_meta(record.id, ended_at=time.time(), end_reason=reason)
        self._recordings.close_lost(record.id, record.egress is not None, reason)
        self._book.store.delete(record.id)

    async def _lost_reason(self, sandbox_id: str) -> str:
        try:
            info = await asyncio.to_thread(self._runtime.exit_info, sandbox_id)
        except Exception:  # the reason is a detail: the session is closed all the same
            log.exception("cannot inspect the lost sandbox %s", sandbox_id)
            return "lost"
        reason = end_reason_of(info) if info is not None else SANDBOX_EXITED
        return reason if reason != SANDBOX_EXITED else "lost"

    async def _remove_unclaimed(self, infos: list[SandboxInfo], claimed: set[str]) -> None:
        for info in infos:
            if info.id in claimed:
                continue
            # Pool containers are not adopted either: one may have served a session whose record was
            # lost, and a used sandbox must never reach another key. The pool refills fresh.
            log.info("removing unowned sandbox %s", info.name)
            await asyncio.to_thread(self._runtime.remove, info.id)

    async def _remove_orphan_networks(self) -> None:
        """Session networks of this instance that no live session uses (a gateway killed between
        making one and recording its session, a teardown that failed), with their host-guard rules."""
        owned = {s.egress.network for s in self._book.sessions() if s.egress is not None}
        networks = await asyncio.to_thread(self._runtime.session_networks, self._specs.instance_labels())
        for network in networks:
            if network.name in owned:
                continue
            log.info("removing orphan session network %s", network.name)
            try:
                await asyncio.to_thread(self._runtime.remove_session_network, network)
            except Exception:
                log.exception("cannot remove orphan network %s", network.name)
