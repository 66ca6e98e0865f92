"""Session lifecycle: create (from the warm pool or cold), track, enforce timeouts, recover, reap.

Runtime calls block, so they run in threads; every background task is kept and cancelled on stop.
Stopping the manager leaves sessions' sandboxes running (a restarted gateway adopts them again) and
removes everything else it started: pooled pairs, and a pair half-started by a refill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import ConfigDict, Field

from corral.contracts.control import LinkEvent
from corral.errors import (
    CapacityError,
    EgressOff,
    EgressUnavailable,
    HermeticUnavailable,
    InvalidRequest,
    SandboxError,
    SandboxUnreachable,
    SessionNotFound,
)
from corral.gateway import auth, controller
from corral.gateway.egress import Egress, EgressManager, Ground
from corral.gateway.grounds import GroundPool
from corral.gateway.limits import HostFacts, Limits, resolve
from corral.gateway.links import LinkBook, LinkRecord
from corral.gateway.models import CreateSession, SessionTerms, UpdateSecrets, Viewport
from corral.gateway.recording import RecordingLimits, RecordingManager
from corral.gateway.replays import ReplayUploads
from corral.gateway.secrets import SecretRecord, SecretSet, plan_create, plan_update
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.threads import in_thread as _in_thread
from corral.gateway.threads import settle as _settle
from corral.gateway.vitals import CONTROLLER_DEAD, ControllerWatch, controller_boot
from corral.runtime import (
    ALIVE_STATES,
    ExitInfo,
    SandboxAddress,
    SandboxRuntime,
    SandboxSpec,
    SessionNetwork,
    State,
)

log = logging.getLogger(__name__)
PLACEHOLDERS_TIMEOUT_S = 2.0  # the watchdog's look at a controller's placeholders: one round, not the loop
HAND_OUT_CHECK_S = 2.0  # the last look at a pooled sandbox before it is handed out
# A pool with no live session beside it is listed every this many reaper ticks (beside live sessions,
# every tick: the same listing covers both). A dead pooled pair is then out of the pool within
# POOL_CHECK_TICKS * reap_interval_s; a claim's own last look stands behind that. The held grounds'
# proxies are judged from the same listing, on the same ticks.
POOL_CHECK_TICKS = 5
# Every this many ticks each pooled sandbox's controller is asked to answer too (the listing sees only a
# container that stopped, not a controller that hangs in a running one, which a claim would otherwise
# find by waiting HAND_OUT_CHECK_S for it before it starts one cold).
POOL_ANSWER_TICKS = 30

KIND_LABEL = "corral.kind"
GATEWAY_LABEL = "corral.gateway"
SANDBOX_EXITED = "sandbox_exited"  # the end reason of a session whose sandbox died under it
CONTROLLER_LOOK_S = 0.25  # how often a relay that lost its controller looks whether it is back


async def _already(egress: Egress) -> Egress:
    return egress


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


def describe_exit(info: ExitInfo) -> str:
    """What ended a sandbox, in words (the WebSocket close reason and the log carry it)."""
    if info.state == "gone":
        return "its container was removed"
    code = f"exit code {info.exit_code}" if info.exit_code is not None else f"state {info.state}"
    return f"out of memory (OOM-killed), {code}" if info.oom_killed else code


@dataclass(frozen=True, slots=True)
class Listing:
    """A reaper tick's one listing of the instance's proxies (session id -> state), and the live
    sessions with egress it was made for (a session started after it may be missing from it)."""

    watched: frozenset[str]
    proxies: Mapping[str, State]
    grounds: tuple[Ground, ...] = ()  # held grounds with a proxy, snapshot before the listing
    taken_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Pair:
    """A started sandbox and its egress (None when egress control is off), before or after a claim."""

    session_id: str
    sandbox: SandboxAddress
    egress: Egress | None


class SessionRecord(SessionTerms):
    """What the gateway keeps about a session, one JSON file each in its data dir (corral.gateway.store):
    with Docker's list of live sandboxes, what a restarted gateway adopts sessions from. Frozen: a
    change (a new policy, a revived proxy) replaces it whole, and the file with it."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    container: str  # the sandbox's id
    owner: str
    token_sha256: str
    egress: Egress | None = None
    # Its brokered secrets' placeholders and bindings (corral.gateway.secrets); their values never.
    secrets: dict[str, SecretRecord] = Field(default_factory=dict)
    # Its viewer links (corral.gateway.links), by id: their secrets' SHA-256 only.
    links: dict[str, LinkRecord] = Field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # A session without secrets or links is written as before they existed (an older gateway reads it alike).
        unset = {name for name in ("secrets", "links") if not getattr(self, name)}
        return self.model_dump(mode="json", exclude=unset or None)


@dataclass
class Session:
    """A live session: its record and what only a live session has (its sandbox's address, activity, state)."""

    record: SessionRecord
    sandbox: SandboxAddress
    last_activity_at: float = field(default_factory=time.time)
    state: str = "ready"
    in_flight: int = 0  # HTTP actions under way: a long one is activity, not idleness
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    removed: asyncio.Event = field(default_factory=asyncio.Event)  # its sandbox and record are gone: its slot is free
    # A stable code: deleted, timeout, idle_timeout, sandbox_exited, controller_dead, egress_proxy_gone.
    end_reason: str = ""
    end_detail: str = ""  # what the code alone does not say (a dead sandbox: OOM-killed, its exit code)
    changing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one PATCH at a time: each sees the last

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def owner(self) -> str:
        return self.record.owner

    @property
    def egress(self) -> Egress | None:
        return self.record.egress

    @egress.setter
    def egress(self, egress: Egress | None) -> None:
        self.record = self.record.model_copy(update={"egress": egress})

    def touch(self) -> None:
        self.last_activity_at = time.time()

    def close_reason(self) -> str:
        """The reason its WebSockets are closed with (code 4000); at most 123 bytes, as RFC 6455 allows."""
        text = f"session ended: {self.end_reason}" + (f" ({self.end_detail})" if self.end_detail else "")
        return text.encode()[:123].decode(errors="ignore")


class SessionManager:
    def __init__(
        self,
        settings: GatewaySettings,
        runtime: SandboxRuntime,
        store: SessionStore,
        on_claim: Callable[[str, float], None] = lambda source, seconds: None,
        host: HostFacts | None = None,
        controller_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = settings
        self.limits: Limits = resolve(settings, host or HostFacts.detect())
        self._runtime = runtime
        self._store = store
        self._sessions: dict[str, Session] = {}
        self._pool: list[Pair] = []
        self.egress = EgressManager(settings, runtime) if settings.egress else None
        # Session networks and CAs made ahead: a cold start takes one rather than wait for Docker to make it.
        self.grounds: GroundPool[Ground] | None = (
            GroundPool(
                self._make_ground,
                self.egress.drop_ground_blocking,
                settings.ground_pool_size,
                fresh=self.egress.ground_fresh,
            )
            if self.egress is not None
            else None
        )
        self.recordings = (
            RecordingManager(settings.data_dir / "recordings", RecordingLimits.from_settings(settings))
            if settings.record
            else None
        )
        self.replays = ReplayUploads(settings.data_dir / "replay-responses", settings.replay_upload_max_mb << 20)
        self._http: httpx.AsyncClient | None = None
        self._controller_transport = controller_transport  # None: the network (a test's fake controllers)
        self._reserved: dict[str, int] = {}  # key id -> sessions being created
        self._lock = asyncio.Lock()
        self._refill = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ends: set[asyncio.Task[None]] = set()  # sessions being ended in the background
        self._starting_pool = 0
        self._on_claim = on_claim  # (source "pool" | "cold", seconds), for the metrics
        self.host_guarded = False
        self.reaper_ticks = 0  # how many the reaper began (the unit tests count its work against them)
        self._controller_probe: asyncio.Task[None] | None = None  # the reaper's round of controller probes
        self.vitals = ControllerWatch(
            settings.controller_max_restarts, settings.controller_restart_window_s, settings.controller_dead_after_s
        )
        self.links = LinkBook(self._links_of, self._save_links, self._report_link)

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        for warning in self.limits.warnings:
            log.warning("limits: %s", warning)
        self.host_guarded = await asyncio.to_thread(self._runtime.ensure_sandbox_network, self._settings.network)
        if self.egress is not None:
            self.host_guarded &= await self.egress.start()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0), transport=self._controller_transport)
        await self._recover()
        await self._remove_orphan_networks()
        # Host guards of networks that went while no gateway watched (a crash, a kill).
        stale = await asyncio.to_thread(self._runtime.remove_stale_guards)
        if stale:
            log.info("removed the host guard of %d networks that are gone", len(stale))
        for session in self._sessions.values():
            self._start_recording(session)  # adopted sessions: their bundles carry on
        if self.grounds is not None:
            self.grounds.start()  # after the orphan networks went: its networks are no orphans
        for coro in (self._reap_loop(), self._pool_loop()):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._refill.set()

    async def stop(self) -> None:
        # A refill under way is cancelled; _start_pair and _cold_start wait for their threads and
        # remove what they started before the cancellation ends them.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Sessions being ended finish ending: their sandboxes are gone or going, their records must go too.
        await asyncio.gather(*self._ends, return_exceptions=True)
        # Pooled pairs are never adopted by the next start (a used sandbox must never reach another
        # key), so they go now rather than run on unowned.
        pool, self._pool = self._pool, []
        await _settle(*(asyncio.ensure_future(self._remove_pair(pair)) for pair in pool))
        if self.grounds is not None:
            await self.grounds.close()  # no session took them: their networks and state go
        if self.recordings is not None:
            await self.recordings.stop_all()
        if self._http is not None:
            await self._http.aclose()

    def _start_recording(self, session: Session, budget_mb: int | None = None) -> None:
        """Record the session's screen and actions (a new one, or an adopted one's bundle carried on)."""
        if self.recordings is None or self._http is None:
            return
        audit = session.egress.audit_path if session.egress is not None else None
        responses = (
            self.egress.responses_path(session.id)
            if self.egress is not None and session.egress is not None and not session.record.hermetic
            else None
        )
        try:
            self.recordings.start(
                session.id,
                session.sandbox.base_url,
                audit,
                self._http,
                session.record.manifest(),
                session.owner,
                responses,
                budget_mb,
                secret=session.sandbox.secret,
            )
        except OSError as exc:
            log.error("cannot record session %s: %s", session.id, exc)

    def _labels(self, kind: str) -> dict[str, str]:
        return {GATEWAY_LABEL: self._settings.instance, KIND_LABEL: kind}

    def _stored_records(self) -> list[SessionRecord]:
        return self._store.load_all(SessionRecord.model_validate)

    def _save(self, session: Session) -> None:
        self._store.save(session.id, session.record.to_json())

    async def _recover(self) -> None:
        """Adopt the sessions whose containers still run; remove containers nobody owns."""
        infos = await asyncio.to_thread(self._runtime.list_sandboxes, {GATEWAY_LABEL: self._settings.instance})
        alive = {info.id: info for info in infos if info.running and info.address is not None}
        claimed: set[str] = set()
        for record in self._stored_records():
            info = alive.get(record.container)
            if info is None or info.address is None:
                if self.egress is not None and record.egress is not None:
                    # Its sandbox died while the gateway was down: the log is kept, as ended.
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self.egress.teardown_blocking, record.egress)
                    with contextlib.suppress(OSError, ValueError):
                        self.egress.write_meta(record.id, ended_at=time.time(), end_reason="lost")
                self._close_lost_recording(record.id, record.egress is not None)
                self._store.delete(record.id)
                continue
            session = Session(record, info.address)
            self._sessions[session.id] = session
            claimed.add(info.id)
            if self.egress is not None and record.egress is not None:
                self.egress.vault.adopt(record.id, record.secrets)  # the values are gone with the last gateway
        await self._remove_unowned_egress()
        for info in infos:
            if info.id in claimed:
                continue
            # Pool containers are not adopted either: one may have served a session whose record was
            # lost, and a used sandbox must never reach another key. The pool refills fresh.
            log.info("removing unowned sandbox %s", info.name)
            await asyncio.to_thread(self._runtime.remove, info.id)
        log.info("recovered %d sessions and %d pooled sandboxes", len(self._sessions), len(self._pool))

    async def _remove_orphan_networks(self) -> None:
        """Session networks of this instance that no live session uses (a gateway killed between
        making one and recording its session, a teardown that failed), with their host-guard rules."""
        owned = {s.egress.network for s in self._sessions.values() if s.egress is not None}
        networks = await asyncio.to_thread(self._runtime.session_networks, {GATEWAY_LABEL: self._settings.instance})
        for network in networks:
            if network.name in owned:
                continue
            log.info("removing orphan session network %s", network.name)
            try:
                await asyncio.to_thread(self._runtime.remove_session_network, network)
            except Exception:
                log.exception("cannot remove orphan network %s", network.name)

    def _close_lost_recording(self, session_id: str, had_egress: bool) -> None:
        """A session that died while the gateway was down: its bundle ends where it stopped."""
        if self.recordings is None:
            return
        responses = self.egress.responses_path(session_id) if self.egress is not None and had_egress else None
        with contextlib.suppress(OSError, ValueError):
            self.recordings.close_ended(session_id, "lost", responses)

    async def _remove_unowned_egress(self) -> None:
        if self.egress is None:
            return
        owned = {s.egress.session_id for s in self._sessions.values() if s.egress is not None}
        states = await asyncio.to_thread(self._runtime.proxy_states, {GATEWAY_LABEL: self._settings.instance})
        for session_id in states:
            if session_id not in owned:
                log.info("removing the unowned egress pair of %s", session_id)
                await asyncio.to_thread(self._runtime.remove_egress, session_id)

    # -- queries ---------------------------------------------------------------------------------------

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id}")
        return session

    def list(self, owner: str | None = None) -> list[Session]:
        return [s for s in self._sessions.values() if owner is None or s.owner == owner]

    def counts(self) -> dict[str, int]:
        return {
            "ready": len(self._sessions),
            "pool": len(self._pool),
            "starting": sum(self._reserved.values()) + self._starting_pool,
        }

    # -- create / delete -------------------------------------------------------------------------------

    def _spec(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        network: SessionNetwork | None = None,
        environment: dict[str, str] | None = None,
        files: dict[str, str] | None = None,
    ) -> SandboxSpec:
        s = self._settings
        res = req.resources if req is not None else None
        cpus = min(res.cpus, s.max_cpus) if res and res.cpus else self.limits.cpus
        memory = min(res.memory_mb, s.max_memory_mb) if res and res.memory_mb else self.limits.memory_mb
        disk = min(res.disk_mb, s.max_disk_mb) if res and res.disk_mb else s.default_disk_mb
        return SandboxSpec(
            image=s.image,
            screen=f"{viewport.width}x{viewport.height}",
            name=f"corral-{kind}-{secrets.token_hex(4)}",
            memory=f"{memory}m",
            cpus=cpus,
            pids=s.default_pids,
            shm_size=f"{s.default_shm_mb}m",
            tmp_size=f"{disk}m",
            workspace_size=s.workspace_size,
            labels=self._labels(kind),
            network=s.network,
            session_network=network,
            environment=environment,
            files=files,
        )

    async def _cold_start(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        allow: Sequence[str],
        mode: str,
        replay: Path | None = None,
        actor: str = "gateway",
    ) -> Pair:
        ahead = False  # its proxy was started ahead, with nothing allowed: the policy is set below
        if self.egress is None:
            session_id = new_session_id()
            (started,), cancelled = await _settle(
                _in_thread(self._runtime.start_sandbox, self._spec(kind, viewport, req))
            )
            if isinstance(started, BaseException):
                raise started
            if cancelled:
                await _settle(_in_thread(self._runtime.remove, started.id))
                raise asyncio.CancelledError
            pair = Pair(session_id, started, None)
        else:
            try:
                pair, ahead = await self._start_pair(kind, viewport, req, allow, mode, replay)
            except BaseException:
                self._refill_grounds()
                raise
        try:
            timeout_s = self._settings.start_timeout_s
            sandbox_ready = asyncio.to_thread(self._runtime.wait_ready, pair.sandbox, timeout_s)
            if self.egress is not None and pair.egress is not None:
                # Either way the session's policy is in force before this returns (and the token with it).
                proxy_ready = (
                    self.egress.set_start_policy(pair.egress, [*allow], mode, actor, timeout_s)
                    if ahead
                    else self.egress.wait_ready(pair.egress, timeout_s)
                )
                await asyncio.gather(sandbox_ready, proxy_ready)
                if replay is not None:
                    await self.egress.check_replay(pair.egress)  # a hermetic session that cannot answer fails here
            else:
                await sandbox_ready
        except BaseException:
            await _settle(asyncio.ensure_future(self._remove_pair(pair, started=False)))
            raise
        finally:
            self._refill_grounds()
        return pair

    def _refill_grounds(self) -> None:
        """After a start, not during it: making a network is Docker's work, and Docker and the CPUs
        are busy with the start's containers until the sandbox answers."""
        if self.grounds is not None:
            self.grounds.refill()

    def _make_ground(self) -> Ground:
        assert self.egress is not None
        # The instance's label alone, no corral.kind: Docker cannot relabel a network, and the session
        # or pooled pair that takes it is not known yet; a kind of "ground" would still say "unclaimed"
        # once claimed. Which grounds are unclaimed is said by the gateway's markers only
        # (EgressManager.unclaimed_grounds); orphan cleanup goes by the live sessions' networks.
        labels = {GATEWAY_LABEL: self._settings.instance}
        return self.egress.make_ground_blocking(new_session_id(), labels, proxy=self._settings.ground_proxies)

    async def _start_pair(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        allow: Sequence[str],
        mode: str,
        replay: Path | None,
    ) -> tuple[Pair, bool]:
        """Network and CA first (made ahead when the ground pool holds one); then the proxy and the
        sandbox start side by side (the sandbox's firewall refuses everything but the proxy until the
        proxy answers), or the sandbox alone when the ground's proxy was started ahead. Returns the
        pair and whether its proxy was started ahead (its policy is still to be set)."""
        assert self.egress is not None
        egress_manager = self.egress
        ground = self.grounds.take() if self.grounds is not None else None
        session_id = ground.session_id if ground is not None else new_session_id()
        # Cancelled anywhere here (a gateway stopping mid-refill), the threads go on: each step waits
        # for them to finish and undoes what they made before the cancellation goes on.
        (prepared,), cancelled = await _settle(
            _in_thread(egress_manager.prepare_blocking, session_id, [*allow], mode, self._labels(kind), replay, ground)
        )
        if isinstance(prepared, BaseException):
            raise prepared
        if cancelled:
            await _settle(_in_thread(egress_manager.discard_blocking, prepared))
            raise asyncio.CancelledError
        spec = self._spec(kind, viewport, req, prepared.network, prepared.sandbox_env, prepared.sandbox_files)
        proxy_start: Awaitable[Egress] = (
            _in_thread(egress_manager.start_proxy_blocking, prepared)
            if prepared.egress is None
            else _already(prepared.egress)  # started ahead with the ground
        )
        (egress, started), cancelled = await _settle(proxy_start, _in_thread(self._runtime.start_sandbox, spec))
        if isinstance(egress, Egress) and isinstance(started, SandboxAddress) and not cancelled:
            return Pair(session_id, started, egress), prepared.egress is not None
        undo = [_in_thread(egress_manager.discard_blocking, prepared)]  # the proxy (by name) and the network
        if isinstance(started, SandboxAddress):
            undo.append(_in_thread(self._runtime.remove, started.id))
        await _settle(*undo)
        if cancelled:
            raise asyncio.CancelledError
        failure = egress if isinstance(egress, BaseException) else started
        assert isinstance(failure, BaseException)  # not both started, not cancelled: one of them failed
        raise failure

    async def _remove_pair(self, pair: Pair, started: bool = True) -> None:
        """Remove a pair's containers and network; one that never ``started`` (it did not come up) keeps
        nothing on disk either: no session came of it."""
        await asyncio.to_thread(self._runtime.remove, pair.sandbox.id)
        if self.egress is not None and pair.egress is not None:
            await asyncio.to_thread(self.egress.teardown_blocking, pair.egress)
            if not started:
                await asyncio.to_thread(self.egress.forget_blocking, pair.session_id)

    async def _answers(self, sandbox: SandboxAddress) -> None:
        """The last look at a pooled sandbox: its controller, the one of this boot, answers now (one
        signed request on the gateway's kept-alive client, proven by the per-boot secret; no thread,
        no screen grab). Its screen and browser were checked as it entered the pool (wait_ready);
        the reaper takes a pooled pair that stopped running out of the pool ahead of any claim.
        Raises SandboxError."""
        assert self._http is not None
        try:
            response = await controller.request(
                self._http, sandbox.base_url, sandbox.secret, "GET", "/v1/secrets", timeout=HAND_OUT_CHECK_S
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"sandbox {sandbox.name} did not answer: {exc}") from None
        if response.status_code != 200:
            raise SandboxUnreachable(f"sandbox {sandbox.name} answered {response.status_code}")

    async def _hand_out(self, pair: Pair, allow: Sequence[str], mode: str, actor: str) -> bool:
        """The last look at a pooled pair, and its policy, side by side: its controller answers, and
        the session's policy set on its proxy (it starts with nothing allowed), whose answer is
        the proxy's own proof of life, each bounded by HAND_OUT_CHECK_S. True once both hold: the
        policy is in force. A pair that fails either (it died while waiting, or hangs) is removed,
        never handed out: False, and the pool refills."""
        checks: list[Awaitable[object]] = [self._answers(pair.sandbox)]
        if self.egress is not None and pair.egress is not None:
            # Bounded like the controller's look (the control call's own bound is 5 s): a proxy that
            # hangs fails the pair, and the claim goes cold at once rather than wait on it.
            policy = self.egress.set_policy(pair.egress, list(allow), mode, actor)
            checks.append(asyncio.wait_for(policy, HAND_OUT_CHECK_S))
        results, cancelled = await _settle(*checks)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is None and not cancelled:
            return True
        if not cancelled:
            log.warning(
                "pooled sandbox %s is not healthy (%s); removing it and starting one", pair.sandbox.name, failure
            )
        self._refill.set()
        await _settle(asyncio.ensure_future(self._remove_pair(pair)))
        if cancelled:
            raise asyncio.CancelledError
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # a KeyboardInterrupt, a SystemExit: not the pair's fault, not to be swallowed
        return False

    def _fits_pool(self, req: CreateSession) -> bool:
        return req.viewport == Viewport() and req.resources.model_dump(exclude_none=True) == {} and req.hermetic is None

    def _admit(self, owner: str, req: CreateSession) -> tuple[int, Path | None]:
        """The session's wall-clock timeout and its hermetic replay's responses; or the refusal, naming
        the field to blame."""
        s = self._settings
        timeout_s = req.timeout_s or s.default_timeout_s
        if timeout_s > s.max_timeout_s:
            raise InvalidRequest(f"timeout_s is at most {s.max_timeout_s}", field="timeout_s")
        if req.secrets and self.egress is None:
            raise EgressOff("secrets need egress control, which this gateway runs without")
        if req.hermetic is None:
            return timeout_s, None
        if self.egress is None:
            raise HermeticUnavailable("hermetic replays need egress control, which this gateway runs without")
        return timeout_s, self.replays.path_for(req.hermetic, owner)  # ReplayNotFound: not this key's upload

    async def _reserve(self, owner: str, req: CreateSession) -> Pair | None:
        """A slot within the caps (429 past them), held until the create ends; and a pooled pair, if one fits."""
        s = self._settings
        async with self._lock:
            total = len(self._sessions) + sum(self._reserved.values())
            mine = len(self.list(owner)) + self._reserved.get(owner, 0)
            if total >= s.max_sessions:
                raise CapacityError(
                    f"the gateway runs {total} sessions, its limit (CORRAL_MAX_SESSIONS={s.max_sessions})"
                )
            if mine >= s.max_sessions_per_key:
                raise CapacityError(f"this API key has {mine} sessions, its limit ({s.max_sessions_per_key})")
            self._reserved[owner] = self._reserved.get(owner, 0) + 1
            return self._pool.pop(0) if self._pool and self._fits_pool(req) else None

    async def create(self, owner: str, req: CreateSession) -> tuple[Session, str]:
        secret_set = plan_create(req.secrets, list(req.allow), req.hermetic is not None)  # checked whole, first
        timeout_s, replay = self._admit(owner, req)
        pooled = await self._reserve(owner, req)
        started = time.monotonic()
        mode = req.egress_mode or self._settings.egress_mode
        actor = auth.OWNER_ACTOR  # the sandbox side reads it (audit records): never the key id
        try:
            if pooled is not None and not await self._hand_out(pooled, req.allow, mode, actor):
                pooled = None
            pair = pooled or await self._cold_start("session", req.viewport, req, list(req.allow), mode, replay, actor)
            await self._claim(pair, secret_set, actor)
        finally:
            async with self._lock:
                self._reserved[owner] -= 1
        self._on_claim("pool" if pooled else "cold", time.monotonic() - started)
        if pooled:
            self._refill.set()
        token = auth.new_token()
        session = Session(
            self._record(pair, owner, token, req, timeout_s, mode, pooled is not None, secret_set), pair.sandbox
        )
        self._save(session)
        self._sessions[session.id] = session
        if self.egress is not None and pair.egress is not None:
            self.egress.write_meta(session.id, owner=owner, created_at=session.record.created_at, ended_at=None)
        self._start_recording(session, req.recording_mb)
        return session, token

    def _record(
        self,
        pair: Pair,
        owner: str,
        token: str,
        req: CreateSession,
        timeout_s: int,
        mode: str,
        from_pool: bool,
        secret_set: SecretSet,
    ) -> SessionRecord:
        now = time.time()
        return SessionRecord(
            id=pair.session_id,
            container=pair.sandbox.id,
            owner=owner,
            token_sha256=auth.digest(token),
            created_at=now,
            expires_at=now + timeout_s,
            idle_timeout_s=req.idle_timeout_s or self._settings.default_idle_timeout_s,
            viewport=req.viewport,
            allow=list(req.allow),
            labels=dict(req.labels),
            from_pool=from_pool,
            egress=pair.egress,
            egress_mode=mode if pair.egress is not None else None,
            hermetic=req.hermetic is not None,
            secrets=dict(secret_set.records),
        )

    async def _claim(self, pair: Pair, secret_set: SecretSet, actor: str) -> None:
        """Make a ready pair the session's: its secrets (its policy is in force already: a cold
        proxy starts with it, a pooled one took it in :meth:`_hand_out`). A pair that fails this is
        removed: it is never handed out."""
        if self.egress is None or pair.egress is None or not secret_set.records:
            return
        try:
            await self._give_secrets(pair, secret_set, SecretSet(), actor)
        except BaseException:
            await _settle(asyncio.ensure_future(self._remove_pair(pair)))
            raise

    async def update_egress(
        self,
        session: Session,
        allow: Sequence[str] | None,
        mode: str | None,
        actor: str,
        secret_changes: UpdateSecrets | None = None,
    ) -> None:
        """Change a live session's allowlist, mode or secrets, validated whole before anything changes;
        the proxy logs each change in the audit chain. The policy goes first, then the secrets (see
        :meth:`_give_secrets`); a step that fails undoes the ones before. A session being ended
        meanwhile (its end waits for this change) raises SessionNotFound and keeps nothing."""
        if self.egress is None or session.egress is None:
            raise EgressUnavailable("this gateway runs sessions without egress control")
        async with session.changing:
            self._still_live(session)
            old_allow, old_mode = session.record.allow, session.record.egress_mode or self._settings.egress_mode
            new_allow = old_allow if allow is None else list(allow)
            new_mode = mode or old_mode
            current = self.egress.vault.get(session.id)
            planned = plan_update(current, secret_changes, new_allow, session.record.hermetic)
            if allow is not None or mode is not None or secret_changes is None:  # a PATCH of secrets alone leaves it
                await self.egress.set_policy(session.egress, new_allow, new_mode, actor)
                self._still_live(session)
            if secret_changes:
                try:
                    await self._give_secrets(Pair(session.id, session.sandbox, session.egress), planned, current, actor)
                    self._still_live(session)
                except BaseException:
                    if session.state == "ready" and (new_allow, new_mode) != (old_allow, old_mode):
                        await self._undo(self.egress.set_policy(session.egress, old_allow, old_mode, actor), session.id)
                    self._record_held_secrets(session)
                    raise
            changed = {"allow": new_allow, "egress_mode": new_mode, "secrets": dict(planned.records)}
            session.record = session.record.model_copy(update=changed)
            self._save(session)

    # -- viewer links (corral.gateway.links keeps them in the record) ---------------------------------

    def _links_of(self, session_id: str) -> dict[str, LinkRecord]:
        return self.get(session_id).record.links

    def _save_links(self, session_id: str, links: Mapping[str, LinkRecord]) -> None:
        session = self.get(session_id)
        session.record = session.record.model_copy(update={"links": dict(links)})
        if session.state == "ready":  # a session being ended keeps no record to write
            self._save(session)

    async def _report_link(self, session_id: str, message: LinkEvent) -> None:
        """A link's change into the session's audit chain (none on a gateway without egress control)."""
        session = self.get(session_id)
        if self.egress is not None and session.egress is not None:
            await self.egress.report(session.egress, message)

    def _still_live(self, session: Session) -> None:
        """Raises SessionNotFound once the session is being ended: a change must not outlive it."""
        if session.state != "ready" or self._sessions.get(session.id) is not session:
            raise SessionNotFound(f"no session {session.id}")

    def _record_held_secrets(self, session: Session) -> None:
        """After a change failed part-way: the record says which secrets the proxy holds (the old
        ones, unless the proxy took the new set). Nothing is written for a session being ended."""
        assert self.egress is not None
        held = dict(self.egress.vault.get(session.id).records)
        if held != session.record.secrets and session.state == "ready":
            log.warning("session %s: its proxy holds the secrets %s after a failed change", session.id, sorted(held))
            session.record = session.record.model_copy(update={"secrets": held})
            self._save(session)

    async def _give_secrets(self, pair: Pair, new: SecretSet, old: SecretSet, actor: str) -> None:
        """``new`` to the session's proxy, its placeholders to its controller (the agent's commands get
        them). The controller gets the old and the new placeholders first, so a failure there changes
        nothing; then the proxy takes the new set (whole or not at all); then the controller drops the
        old placeholders. A failure after the first step leaves only extra placeholders in the agent's
        environment, which the proxy refuses (revoked) or leaves alone (not yet added); the watchdog
        puts the right set again."""
        assert self.egress is not None and pair.egress is not None
        both = {**old.placeholders(), **new.placeholders()}
        await self._put_placeholders(pair.sandbox, both)
        await self.egress.set_secrets(pair.egress, new, actor)
        if both != new.placeholders():
            try:
                await self._put_placeholders(pair.sandbox, new.placeholders())
            except SandboxError as exc:
                log.warning("session %s: its controller keeps revoked placeholders for now: %s", pair.session_id, exc)

    async def _put_placeholders(self, sandbox: SandboxAddress, placeholders: dict[str, str]) -> None:
        assert self._http is not None
        try:
            response = await controller.request(
                self._http, sandbox.base_url, sandbox.secret, "PUT", "/v1/secrets", json={"secrets": placeholders}
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the controller of {sandbox.name} did not take its secrets: {exc}") from None
        if response.status_code >= 300:
            raise SandboxUnreachable(
                f"the controller of {sandbox.name} refused its secrets' placeholders ({response.status_code})"
            )

    async def _get_placeholders(self, sandbox: SandboxAddress) -> dict[str, str] | None:
        """The placeholders the controller holds; None when it cannot say (an older image)."""
        assert self._http is not None
        try:
            response = await controller.request(
                self._http, sandbox.base_url, sandbox.secret, "GET", "/v1/secrets", timeout=PLACEHOLDERS_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the controller of {sandbox.name} did not show its secrets: {exc}") from None
        try:
            held = response.json().get("secrets") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            held = None
        return {str(k): str(v) for k, v in held.items()} if isinstance(held, dict) else None

    async def _check_placeholders(self) -> None:
        """Every live session with secrets: its controller holds their placeholders, else it is given
        them again. A controller restarted inside its container starts with none (the agent's next
        commands would lack them), and one whose last PATCH failed after its first step keeps
        revoked ones. One signed GET per such session a round (sessions without secrets cost nothing):
        cheaper and surer than following the controller's boot id, which only a recording sees."""
        assert self.egress is not None
        vault = self.egress.vault
        live = [
            s
            for s in self._sessions.values()
            if s.state == "ready" and (s.record.secrets or vault.get(s.id).records or vault.pending(s.id))
        ]
        await asyncio.gather(*(self._hold_placeholders(session) for session in live))

    async def _hold_placeholders(self, session: Session) -> None:
        if session.changing.locked():
            return  # a change under way puts them itself
        async with session.changing:
            if session.state != "ready":
                return
            self._record_held_secrets(session)  # the watchdog took a change whose answer was lost
            expected = SecretSet(session.record.secrets).placeholders()
            try:
                if await self._get_placeholders(session.sandbox) != expected:
                    log.warning(
                        "session %s: its controller lost its secrets' placeholders; putting them again", session.id
                    )
                    await self._put_placeholders(session.sandbox, expected)
            except SandboxError as exc:
                log.debug("session %s: placeholders not checked: %s", session.id, exc)  # next round

    @staticmethod
    async def _undo(step: Awaitable[object], session_id: str) -> None:
        """One step of a failed change undone; its own failure is logged, the first one raised."""
        try:
            await step
        except Exception:
            log.exception("session %s: a failed change could not be undone", session_id)

    async def delete(self, session_id: str, reason: str = "deleted") -> None:
        session = self._sessions.get(session_id)
        if session is None or session.state == "stopping":
            raise SessionNotFound(f"no session {session_id}")
        self._mark_ended(session, reason)
        await self._end(session)

    def _mark_ended(self, session: Session, reason: str, detail: str = "") -> None:
        """From here the session is over for its clients: its WebSockets close (4000) at once."""
        session.state = "stopping"
        session.end_reason, session.end_detail = reason, detail
        session.ended.set()

    def _end_soon(self, session: Session, reason: str, detail: str = "", drain_s: float = 5.0) -> None:
        """End a session from the background (the reaper, a relay that lost its sandbox): marked
        ended now, removed by a kept task, so one slow removal never holds up the reaper."""
        if session.state == "stopping":
            return
        self._mark_ended(session, reason, detail)

        async def end() -> None:
            try:
                await self._end(session, drain_s)
            except Exception:
                log.exception("could not end session %s", session.id)

        task = asyncio.create_task(end())
        self._ends.add(task)
        task.add_done_callback(self._ends.discard)

    async def _end(self, session: Session, drain_s: float = 5.0) -> None:
        # A change under way finishes first (it sees the session ending and keeps nothing): nothing is
        # set on a proxy, kept in the vault or written to the store after the teardown.
        async with session.changing:
            await self._teardown(session, drain_s)

    async def _teardown(self, session: Session, drain_s: float) -> None:
        session_id, reason = session.id, session.end_reason
        if self.recordings is not None:
            # Before the sandbox goes: the recorder takes the events its controller still holds (and
            # closes the bundle even when that takes too long).
            with contextlib.suppress(Exception):
                await self.recordings.stop(session_id, reason, drain_s=drain_s)
        try:
            await asyncio.to_thread(self._runtime.remove, session.sandbox.id)
            if self.egress is not None and session.egress is not None:
                await asyncio.to_thread(self.egress.teardown_blocking, session.egress)
                ended: dict[str, Any] = {"ended_at": time.time(), "end_reason": reason}
                if session.end_detail:
                    ended["end_detail"] = session.end_detail
                self.egress.write_meta(session.id, **ended)
                if self.recordings is not None and not session.record.hermetic:
                    # The proxy is gone, so its responses file is complete: it joins the bundle.
                    responses = self.egress.responses_path(session.id)
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(self.recordings.attach_responses, session.id, responses)
        except Exception:
            # Keep the record: the reaper tries again, and a used sandbox never looks unowned.
            session.state = "ready"
            raise
        self._sessions.pop(session_id, None)
        self._store.delete(session_id)
        session.removed.set()
        log.info("session %s ended: %s", session_id, reason)

    # -- liveness --------------------------------------------------------------------------------------

    async def _check_sandboxes(self, pool_due: bool = True) -> Listing | None:
        """End every session whose sandbox no longer runs (killed, OOM-killed, removed by hand), and
        take the pooled pairs that stopped running out of the pool: one listing of the sandboxes a
        tick and one of the proxies (which the egress watchdog takes too), an inspect only for the
        dead. A pool with no live session beside it is listed only when ``pool_due`` (every
        POOL_CHECK_TICKS ticks): an idle gateway then asks Docker nothing most ticks, and a claim's
        own last look (:meth:`_hand_out`) stands behind the pool's check anyway. Returns the
        proxies' listing when one was made."""
        live = [s for s in self._sessions.values() if s.state == "ready"]
        # Before the listing: a pair that joins meanwhile may be missing from it.
        pooled = list(self._pool) if live or pool_due else []
        grounds: tuple[Ground, ...] = ()
        if pool_due and self.grounds is not None:
            grounds = tuple(g for g in self.grounds.held() if g.egress is not None)
        if not live and not pooled and not grounds:
            return None
        labels = {GATEWAY_LABEL: self._settings.instance}
        states: Mapping[str, State] = {}
        if live or pooled:
            states = await asyncio.to_thread(self._runtime.sandbox_states, labels)
        listing = None
        if self.egress is not None and (
            any(s.egress is not None for s in live) or any(p.egress is not None for p in pooled) or grounds
        ):
            # Snapshot first, as above: only these sessions' proxies are sure to be in the listing.
            watched = frozenset(s.id for s in live if s.egress is not None)
            listing = Listing(watched, await asyncio.to_thread(self._runtime.proxy_states, labels), grounds)
        for session in live:
            if states.get(session.sandbox.id) not in ALIVE_STATES:
                await self._end_if_dead(session)
        await self._check_pool(pooled, states, listing.proxies if listing is not None else {})
        return listing

    async def _check_pool(
        self, pooled: Sequence[Pair], states: Mapping[str, State], proxies: Mapping[str, State]
    ) -> None:
        """The ``pooled`` pairs whose sandbox (from the reaper's listing, ``states``) or proxy (its
        listing, ``proxies``, by session) stopped running leave the pool ahead of any claim, and the
        pool refills: a claim then rarely meets a dead one (its own last look, :meth:`_hand_out`,
        still stands behind this)."""
        dead = [
            pair
            for pair in pooled
            if pair in self._pool  # a claim may have taken it meanwhile
            and (
                states.get(pair.sandbox.id) not in ALIVE_STATES
                or (pair.egress is not None and proxies.get(pair.session_id) != "running")
            )
        ]
        await self._drop_pooled(dead, "stopped running")

    async def _check_pool_answers(self) -> None:
        """Every pooled sandbox's controller answers (the claim's own look, :meth:`_answers`, all at
        once); one that does not leaves the pool and is removed, and the pool refills."""
        pooled = list(self._pool)
        results = await asyncio.gather(*(self._answers(pair.sandbox) for pair in pooled), return_exceptions=True)
        dead = [pair for pair, result in zip(pooled, results, strict=True) if isinstance(result, Exception)]
        dead = [pair for pair in dead if pair in self._pool]  # a claim may have taken it meanwhile
        await self._drop_pooled(dead, "does not answer")

    async def _drop_pooled(self, dead: Sequence[Pair], why: str) -> None:
        """Pooled pairs out of the pool and removed; the pool refills."""
        for pair in dead:
            self._pool.remove(pair)
            log.warning("pooled sandbox %s %s; removing it and starting one", pair.sandbox.name, why)
        if dead:
            self._refill.set()
            _, cancelled = await _settle(*(asyncio.ensure_future(self._remove_pair(pair)) for pair in dead))
            if cancelled:
                # A stop came while the removals ran: they are done, and the reaper ends with the stop
                # (swallowed here, the cancellation left the loop ticking and the stop waiting on it).
                raise asyncio.CancelledError

    async def _watch_egress(self, listing: Listing | None) -> None:
        """The egress watchdog's round: every live session's proxy running (restarted when not, its
        session ended when it is gone), its policy and secrets the gateway's, its chain head
        anchored. From the tick's own listing of the proxies when there is one (a session that
        started after it waits for the next round) unless that is older than a tick; else the watchdog
        lists them itself."""
        assert self.egress is not None
        if listing is not None and time.monotonic() - listing.taken_at > self._settings.reap_interval_s:
            # The tick was slow (a dead pooled pair's removal, an inspect): Docker may have restarted
            # a proxy since, which a stale listing would have the watchdog restart once more.
            listing = None
        live = [s.egress for s in self._sessions.values() if s.egress is not None and s.state == "ready"]
        if listing is not None:
            live = [egress for egress in live if egress.session_id in listing.watched]
        # Fail closed and come back: a dead proxy means no egress until it is restarted here.
        revived, gone = await self.egress.revive(live, listing.proxies if listing is not None else None)
        for session_id, egress in revived.items():
            if session_id in self._sessions:
                self._sessions[session_id].egress = egress
                self._save(self._sessions[session_id])
        for session_id in gone:
            if session_id in self._sessions:
                self._end_soon(self._sessions[session_id], "egress_proxy_gone")

    async def _end_if_dead(self, session: Session) -> bool:
        info = await asyncio.to_thread(self._runtime.exit_info, session.sandbox.id)
        if info is None or session.state != "ready":
            return False
        detail = describe_exit(info)
        log.warning("session %s: its sandbox %s died (%s); ending it", session.id, session.sandbox.name, detail)
        # Nothing left to drain from a dead controller: the bundle closes at once.
        self._end_soon(session, SANDBOX_EXITED, detail, drain_s=0.0)
        return True

    def _probe_controllers(self) -> None:
        """One round of :meth:`_check_controllers` at a time, as a task of the manager's own."""
        if self._controller_probe is not None and not self._controller_probe.done():
            return
        task = asyncio.create_task(self._check_controllers_logged())
        self._controller_probe = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check_controllers_logged(self) -> None:
        try:
            await self._check_controllers()
        except Exception:
            log.exception("controller liveness check failed")

    async def _check_controllers(self) -> None:
        """Every live session's controller asked who it is (all at once); one that cannot stay up
        (corral.gateway.vitals) ends its session with controller_dead, its recording kept as it stands."""
        if self._http is None:
            return
        live = [s for s in self._sessions.values() if s.state == "ready"]
        self.vitals.keep_only([s.id for s in live])
        boots = await asyncio.gather(*(controller_boot(self._http, s.sandbox) for s in live))
        now = time.monotonic()
        for session, boot in zip(live, boots, strict=True):
            why = self.vitals.saw(session.id, boot, now)
            if why is not None and session.state == "ready":
                log.warning("session %s: its controller cannot stay up (%s); ending it", session.id, why)
                self._end_soon(session, CONTROLLER_DEAD, why, drain_s=0.0)

    async def check_sandbox(self, session: Session, within_s: float = 1.0) -> None:
        """The relay lost its sandbox connection: if the container died, the session ends now (the
        relay then closes with 4000 and the reason). Docker marks a container exited a moment after
        its processes die, so this looks a few times. A controller restarted inside a running
        container is no death: this then waits until it answers again (the client's reconnect then
        finds it) or is judged dead (:meth:`_await_controller`), and the session lives on or not."""
        deadline = time.monotonic() + within_s
        while session.state == "ready":
            try:
                if await self._end_if_dead(session):
                    return
            except Exception:
                log.exception("cannot inspect the sandbox of session %s", session.id)
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        await self._await_controller(session)

    async def _await_controller(self, session: Session) -> None:
        """Until the session's controller answers, or the watch (corral.gateway.vitals) finds it
        cannot stay up and the session ends with controller_dead, looked at every
        CONTROLLER_LOOK_S; at most controller_dead_after_s and a look more."""
        if self._http is None:
            return
        deadline = time.monotonic() + self._settings.controller_dead_after_s + CONTROLLER_LOOK_S
        while session.state == "ready" and time.monotonic() < deadline:
            boot = await controller_boot(self._http, session.sandbox)
            if session.state != "ready":
                return
            why = self.vitals.saw(session.id, boot, time.monotonic())
            if why is not None:
                log.warning("session %s: its controller cannot stay up (%s); ending it", session.id, why)
                self._end_soon(session, CONTROLLER_DEAD, why, drain_s=0.0)
                return
            if boot is not None:
                return
            await asyncio.sleep(CONTROLLER_LOOK_S)

    # -- background ------------------------------------------------------------------------------------

    async def _reap_loop(self) -> None:
        last_prune = 0.0
        tick = 0
        while True:
            await asyncio.sleep(self._settings.reap_interval_s)
            now = time.time()
            tick += 1
            self.reaper_ticks = tick
            listing = None
            try:
                listing = await self._check_sandboxes(pool_due=tick % POOL_CHECK_TICKS == 0)
            except Exception:
                log.exception("sandbox liveness check failed")
            try:
                self._check_grounds(listing)
            except Exception:
                log.exception("ground proxy check failed")
            if self.egress is not None:
                try:
                    await self._watch_egress(listing)
                except Exception:
                    log.exception("egress watchdog failed")
                try:
                    await self._check_placeholders()
                except Exception:
                    log.exception("placeholder watchdog failed")
            # After the watchdog (its listing must be fresh), and beside the loop rather than in it: a
            # controller that does not answer holds its probe up to vitals.PROBE_TIMEOUT_S, which must not
            # hold up the next tick's liveness check (a dead sandbox is found within a tick).
            self._probe_controllers()
            if tick % POOL_ANSWER_TICKS == 0:
                try:
                    # After the watchdog: a pooled controller that does not answer holds this up to 2 s.
                    await self._check_pool_answers()
                except Exception:
                    log.exception("pool answer check failed")
            if now - last_prune > 3600:
                last_prune = now
                await self._prune()
            for session in list(self._sessions.values()):
                reason = None
                if now >= session.record.expires_at:
                    reason = "timeout"
                elif session.in_flight == 0 and now - session.last_activity_at >= session.record.idle_timeout_s:
                    reason = "idle_timeout"
                if reason is not None:
                    self._end_soon(session, reason)

    def _check_grounds(self, listing: Listing | None) -> None:
        """Held grounds whose proxy, started ahead, stopped running leave the pool and are made again,
        judged from the tick's own listing (every POOL_CHECK_TICKS ticks, with the pool's): only the
        grounds held before it was made, and still held (a cold start may have taken one meanwhile)."""
        if self.grounds is None or listing is None or not listing.grounds:
            return
        held = self.grounds.held()
        dead = [
            g
            for g in listing.grounds
            # Running only: a cold start's policy call fails on a proxy Docker is restarting, and a
            # ground is cheap to make again.
            if g in held and listing.proxies.get(g.session_id) != "running"
        ]
        for ground in dead:
            log.warning("the proxy started ahead for ground %s is not running; making another", ground.session_id)
        self.grounds.retire(dead)

    async def _prune(self) -> None:
        """Archives past their retention: egress logs, recordings, uploaded replay responses."""
        s = self._settings
        try:
            if self.egress is not None:
                # Held grounds have no metadata yet: not to be taken for a pool pair's leftovers.
                held = {g.session_id for g in self.grounds.held()} if self.grounds is not None else set()
                live = set(self._sessions) | held
                await asyncio.to_thread(self.egress.prune, s.egress_retention_days * 86400, live)
            if self.recordings is not None:
                await asyncio.to_thread(self.recordings.prune, s.recording_retention_days * 86400)
            await asyncio.to_thread(self.replays.prune, s.replay_upload_retention_hours * 3600)
        except Exception:
            log.exception("pruning the archives failed")

    async def _pool_loop(self) -> None:
        while True:
            await self._refill.wait()
            self._refill.clear()
            while len(self._pool) + self._starting_pool < self._settings.pool_size:
                self._starting_pool += 1
                try:
                    pair = await self._cold_start("pool", Viewport(), None, [], self._settings.egress_mode)
                    self._pool.append(pair)
                except Exception:
                    log.exception("could not start a pooled sandbox; retrying in 5 s")
                    await asyncio.sleep(5)
                finally:
                    self._starting_pool -= 1
