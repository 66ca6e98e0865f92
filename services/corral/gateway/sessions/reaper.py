"""The reaper: every ``reap_interval_s`` one tick ends the sessions past their timeout or idle too long,
and the ones whose sandbox died (one listing of the sandboxes a tick and one of the proxies, shared
with the egress rounds and the pool's check; an idle pool alone every POOL_CHECK_TICKS ticks, when
pooled pairs on a machine that takes no new sessions are replaced too), retires
held grounds whose proxy stopped, asks the controllers who they are (beside the loop, every
CONTROLLER_PROBE_TICKS ticks), and prunes the
archives hourly. A tick can be driven directly (:meth:`Reaper.tick`), its clock injected."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from corral.gateway.replays import ReplayUploads
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.endings import Endings
from corral.gateway.sessions.liveness import Liveness
from corral.gateway.sessions.pausing import Pauses
from corral.gateway.sessions.pool import WarmPool
from corral.gateway.sessions.records import Listing
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Specs, Starts
from corral.gateway.settings import GatewaySettings
from corral.runtime import ALIVE_STATES, SandboxRuntime, State

log = logging.getLogger(__name__)
# A pool with no live session beside it is listed every this many reaper ticks (beside live sessions,
# every tick: the same listing covers both). A dead pooled pair is then out of the pool within
# POOL_CHECK_TICKS * reap_interval_s; a claim's own last look stands behind that. The held grounds'
# proxies are judged from every listing of the proxies: beside live sessions every tick, else on these.
POOL_CHECK_TICKS = 5
# Every this many ticks each pooled sandbox's controller is asked to answer too (the listing sees only a
# container that stopped, not a controller that hangs in a running one, which a claim would otherwise
# find by waiting HAND_OUT_CHECK_S for it before it starts one cold).
POOL_ANSWER_TICKS = 30
# Every this many ticks each live session's controller is asked who it is (corral.gateway.vitals): its
# verdicts are counted in tens of seconds (no answer for controller_dead_after_s, 60 s; more than
# controller_max_restarts new boots in 300 s), so a look a second cost each idle session a signed
# request on both sides for nothing those verdicts need (docs/design/0445). A relay that lost its
# controller still looks at once (Liveness.check_sandbox).
CONTROLLER_PROBE_TICKS = 5
PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True, slots=True)
class Round:
    """One of the egress rounds a tick runs after its listing (the egress and placeholder watchdogs)."""

    name: str
    run: Callable[[Listing | None], Awaitable[None]]


class Archives:
    """What outlives sessions, kept for its retention: egress logs, recordings, uploaded replay responses."""

    def __init__(
        self,
        settings: GatewaySettings,
        book: SessionBook,
        starts: Starts,
        egress: EgressPort,
        recordings: SessionRecordings,
        replays: ReplayUploads,
    ) -> None:
        self._settings, self._book, self._starts = settings, book, starts
        self._egress, self._recordings, self._replays = egress, recordings, replays

    async def prune(self) -> None:
        s = self._settings
        try:
            # Held grounds have no metadata yet: not to be taken for a pool pair's leftovers.
            live = self._book.ids() | {g.session_id for g in self._starts.held_grounds()}
            await asyncio.to_thread(self._egress.prune, s.egress_retention_days * 86400, live)
            await self._recordings.prune(s.recording_retention_days * 86400)
            await asyncio.to_thread(self._replays.prune, s.replay_upload_retention_hours * 3600)
        except Exception:
            log.exception("pruning the archives failed")


class Reaper:
    def __init__(
        self,
        runtime: SandboxRuntime,
        specs: Specs,
        book: SessionBook,
        pool: WarmPool,
        starts: Starts,
        liveness: Liveness,
        endings: Endings,
        archives: Archives,
    ) -> None:
        self._runtime, self._specs, self._book, self._pool, self._starts = runtime, specs, book, pool, starts
        self._liveness, self._endings = liveness, endings
        self.archives = archives
        self._rounds: list[Round] = []
        self.clock: Callable[[], float] = time.monotonic  # when a listing was taken (a test moves it on)
        self.ticks = 0  # how many began (the unit tests count its work against them)
        self._last_prune = 0.0
        self.pauses: Pauses | None = None  # the idle pause and the paused sessions' expiry (set by the wiring)
        # Every warm pool: the base's, and one per template in CORRAL_POOL (set by the wiring).
        self.pools: Callable[[], list[WarmPool]] = lambda: [self._pool]

    def add_rounds(self, *rounds: Round) -> None:
        """Rounds each tick runs after its listing, in order (the wiring adds the egress ones)."""
        self._rounds += rounds

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.tick()

    async def tick(self) -> None:
        now = time.time()
        self.ticks += 1
        listing = None
        try:
            listing = await self._check_sandboxes(pool_due=self.ticks % POOL_CHECK_TICKS == 0)
        except Exception:
            log.exception("sandbox liveness check failed")
        try:
            self._check_grounds(listing)
        except Exception:
            log.exception("ground proxy check failed")
        for round_ in self._rounds:
            try:
                await round_.run(listing)
            except Exception:
                log.exception("%s failed", round_.name)
        # After the watchdog (its listing must be fresh), and beside the loop rather than in it: a
        # controller that does not answer holds its probe up to vitals.PROBE_TIMEOUT_S, which must not
        # hold up the next tick's liveness check (a dead sandbox is found within a tick).
        if self.ticks % CONTROLLER_PROBE_TICKS == 0:
            self._liveness.probe()
        if self.ticks % POOL_ANSWER_TICKS == 0:
            try:
                # After the watchdog: a pooled controller that does not answer holds this up to 2 s.
                for pool in self.pools():
                    await pool.check_answers()
            except Exception:
                log.exception("pool answer check failed")
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            await self.archives.prune()
        self._time_out(now)

    def _time_out(self, now: float) -> None:
        for session in self._book.sessions():
            reason = None
            if session.paused:  # its wall clock stands still; its own expiry (CORRAL_PAUSED_TTL_S) runs
                if self.pauses is not None and self.pauses.expired(session, now):
                    self._endings.end_soon(session, "paused_expired")
                continue
            if now >= session.record.expires_at:
                reason = "timeout"
            elif session.in_flight == 0 and now - session.last_activity_at >= session.record.idle_timeout_s:
                if session.record.idle_action == "pause" and self.pauses is not None and session.state == "ready":
                    self.pauses.pause_soon(session)
                    continue
                reason = "idle_timeout"
            if reason is not None:
                self._endings.end_soon(session, reason)

    async def _check_sandboxes(self, pool_due: bool = True) -> Listing | None:
        """End every session whose sandbox no longer runs (killed, OOM-killed, removed by hand), and
        take the pooled pairs that stopped running out of the pool: one listing of the sandboxes a
        tick and one of the proxies (which the egress watchdog takes too), an inspect only for the
        dead. A pool with no live session beside it is listed only when ``pool_due`` (every
        POOL_CHECK_TICKS ticks): an idle gateway then asks Docker nothing most ticks, and a claim's
        own last look (:meth:`WarmPool.hand_out`) stands behind the pool's check anyway. Returns the
        proxies' listing when one was made."""
        live = self._book.ready()
        # Before the listing: a pair that joins meanwhile may be missing from it.
        pools = self.pools() if live or pool_due else []
        pooled = [pair for pool in pools for pair in pool.pairs()]
        held = tuple(g for g in self._starts.held_grounds() if g.egress is not None)
        grounds = held if pool_due else ()  # what makes a listing of its own: every few ticks
        if pool_due and not live and not pooled:
            # Nothing lists the sandboxes this tick; the machines are looked at all the same: on a
            # swarm that is what keeps each node's guard label true while the gateway is idle (a node
            # down loses it, one back gets it again: 0430). A single host's look asks Docker nothing.
            await self._closed_nodes()
        if not live and not pooled and not grounds:
            return None
        labels = self._specs.instance_labels()
        states: Mapping[str, State] = {}
        if live or pooled:
            states = await asyncio.to_thread(self._runtime.sandbox_states, labels)
        listing = None
        if any(s.egress is not None for s in live) or any(p.egress is not None for p in pooled) or grounds:
            # Snapshot first, as above: only these sessions' proxies are sure to be in the listing.
            watched = frozenset(s.id for s in live if s.egress is not None)
            proxies = await asyncio.to_thread(self._runtime.proxy_states, labels)
            # Every held ground is judged from any listing made, not only on the few ticks that make
            # one for them: it costs nothing more, and a ground whose proxy ran on a machine just lost
            # leaves in the tick that ends the sessions there (a cold start right after took it and
            # waited minutes for a proxy that never answers: docs/design/0465).
            listing = Listing(watched, proxies, held, self.clock())
        for session in live:
            if states.get(session.sandbox.id) not in ALIVE_STATES:
                await self._liveness.end_if_dead(session)
        listed = listing.proxies if listing is not None else {}
        closed = await self._closed_nodes() if pooled and pool_due else frozenset[str]()
        for pool in pools:
            mine = {id(pair) for pair in pool.pairs()}
            await pool.check([pair for pair in pooled if id(pair) in mine], states, listed, closed)
        return listing

    async def _closed_nodes(self) -> frozenset[str]:
        """The machines that take no new sessions (paused, drained, down): their pooled pairs are
        replaced. One listing, with the pool's check; nothing on a runtime of one machine."""
        try:
            nodes = await asyncio.to_thread(self._runtime.nodes)
        except Exception:  # the pool's own check goes on: a pooled pair on a closed machine waits a round
            log.exception("listing the nodes failed")
            return frozenset()
        return frozenset(node.name for node in nodes if not node.takes_sessions)

    def _check_grounds(self, listing: Listing | None) -> None:
        """Held grounds whose proxy, started ahead, stopped running leave the pool and are made again,
        judged from the tick's own listing (every tick that lists the proxies; every POOL_CHECK_TICKS
        ticks at least): only the grounds held before it was made, and still held (a cold start may
        have taken one meanwhile)."""
        if listing is None or not listing.grounds:
            return
        held = self._starts.held_grounds()
        dead = [
            g
            for g in listing.grounds
            # Running only: a cold start's policy call fails on a proxy Docker is restarting, and a
            # ground is cheap to make again.
            if g in held and listing.proxies.get(g.session_id) != "running"
        ]
        for ground in dead:
            log.warning("the proxy started ahead for ground %s is not running; making another", ground.session_id)
        self._starts.retire_grounds(dead)


class EgressWatch:
    """The egress watchdog's round: every live session's proxy running (restarted when not, its
    session ended when it is gone), its policy and secrets the gateway's, its chain head anchored."""

    def __init__(
        self, book: SessionBook, egress: EgressPort, endings: Endings, reaper: Reaper, max_age_s: float
    ) -> None:
        self._book, self._egress, self._endings, self._reaper = book, egress, endings, reaper
        self._max_age_s = max_age_s

    async def watch(self, listing: Listing | None) -> None:
        """From the tick's own listing of the proxies when there is one (a session that started after
        it waits for the next round) unless that is older than a tick; else the watchdog lists them itself."""
        if listing is not None and self._reaper.clock() - listing.taken_at > self._max_age_s:
            # The tick was slow (a dead pooled pair's removal, an inspect): Docker may have restarted
            # a proxy since, which a stale listing would have the watchdog restart once more.
            listing = None
        live = [s.egress for s in self._book.ready() if s.egress is not None]
        if listing is not None:
            live = [egress for egress in live if egress.session_id in listing.watched]
        # Fail closed and come back: a dead proxy means no egress until it is restarted here.
        revived, gone = await self._egress.revive(live, listing.proxies if listing is not None else None)
        for session_id, egress in revived.items():
            session = self._book.find(session_id)
            if session is not None:
                session.egress = egress
                self._book.save(session)
        for session_id in gone:
            session = self._book.find(session_id)
            if session is not None:
                self._endings.end_soon(session, "egress_proxy_gone")
