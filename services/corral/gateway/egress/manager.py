"""Each session's egress: its own internal network, its mitmproxy sidecar, its CA, its audit log.

:class:`EgressManager` is what the session side holds: a thin composition of the pair's life through
the runtime (:class:`~.provision.Provisioner`, on the state in :class:`~.state.EgressState`), what
the gateway tells a running proxy (:class:`~.channel.ProxyChannel`), the watchdog's look at it
(:class:`~.watch.ProxyWatch`), the policies and chain heads it holds proxies to
(:class:`~.ledger.PolicyLedger`) and the archive (:class:`~.archive.EgressArchive`). It is the only
place that talks to proxies.

The proxy is the single writer of the session's audit log (policy changes included, so the chain
stays one line); the gateway only reads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from corral.contracts.control import GatewayEvent, Reply
from corral.errors import EgressUnavailable, ReplayUnreadable, SandboxError
from corral.gateway.anchors import AnchorBook
from corral.gateway.secrets import SecretSet, SecretVault
from corral.gateway.settings import GatewaySettings
from corral.runtime import SandboxRuntime, State

from .archive import AuditLogEntry, EgressArchive, SessionMeta
from .channel import ProxyChannel
from .ledger import PolicyLedger
from .mirror import StateMirror
from .pairs import PROXY_BUSY_STATES, Egress, Ground, PolicyView, Prepared
from .provision import Provisioner
from .state import EgressState, ProxyTokens
from .watch import ProxyWatch

log = logging.getLogger(__name__)


class EgressManager:
    """Makes, watches and tears down egress pairs; the session side's one way to them."""

    def __init__(self, settings: GatewaySettings, runtime: SandboxRuntime) -> None:
        self.anchors = AnchorBook(settings.data_dir)  # outside the egress root: no proxy ever mounts it
        self.vault = SecretVault()  # each session's secrets, as the gateway last set them on its proxy
        self.tokens = ProxyTokens(settings.data_dir)
        self.ledger = PolicyLedger(self.anchors)
        self.state = EgressState(settings, self.anchors)
        self.root = self.state.root
        self.provision = Provisioner(settings, runtime, self.state, self.tokens, self.ledger)
        self.channel = ProxyChannel(self.tokens, self.ledger, self.vault)
        self.watch = ProxyWatch(self.channel, self.ledger, self.vault, self.tokens)
        self.archive = EgressArchive(self.state, self.ledger)
        # A runtime whose proxies write into no directory of the gateway's: their state mirrored.
        unshared = not getattr(runtime, "shares_proxy_state", True)  # None in tests of the state alone
        self.mirror = StateMirror(settings, self.tokens, self.channel, active=unshared)

    @property
    def control_port(self) -> int:
        return self.channel.control_port

    @control_port.setter
    def control_port(self, port: int) -> None:
        self.channel.control_port = port

    async def start(self) -> bool:
        """The egress network, the archive and the token key; whether the host guard holds."""
        return await self.provision.start()

    def token(self, session_id: str) -> str:
        return self.tokens.token(session_id)

    # -- the pair's life ------------------------------------------------------------------------------

    def state_dir(self, session_id: str) -> Path:
        return self.state.state_dir(session_id)

    def responses_path(self, session_id: str) -> Path:
        return self.state.responses_path(session_id)

    def make_ground_blocking(self, session_id: str, labels: dict[str, str], proxy: bool = False) -> Ground:
        return self.provision.make_ground_blocking(session_id, labels, proxy)

    def ground_fresh(self, ground: Ground, now: float | None = None) -> bool:
        return self.provision.ground_fresh(ground, now)

    def drop_ground_blocking(self, ground: Ground) -> None:
        self.provision.drop_ground_blocking(ground)
        self.channel.forget(ground.session_id)
        self.mirror.forget(ground.session_id)

    def unclaimed_grounds(self) -> list[str]:
        return self.state.unclaimed_grounds()

    def remove_unclaimed_grounds(self) -> list[str]:
        return self.state.remove_unclaimed_grounds()

    def prepare_blocking(
        self,
        session_id: str,
        allow: list[str],
        mode: str,
        labels: dict[str, str],
        replay: Path | None = None,
        ground: Ground | None = None,
    ) -> Prepared:
        return self.provision.prepare_blocking(session_id, allow, mode, labels, replay, ground)

    def start_proxy_blocking(self, prepared: Prepared) -> Egress:
        return self.provision.start_proxy_blocking(prepared)

    async def set_start_policy(self, egress: Egress, allow: list[str], mode: str, actor: str, timeout_s: float) -> None:
        """The session's policy on a proxy started ahead (with nothing allowed): once it answers, set
        and acknowledged, with the generation after the start's (any other change is said loudly)."""
        await self.wait_ready(egress, timeout_s)
        await self.set_policy(egress, allow, mode, actor)

    async def wait_ready(self, egress: Egress, timeout_s: float) -> None:
        """Until the proxy answers; EgressUnavailable (with its last lines) once it never will."""
        started = time.monotonic()
        checked = started
        while True:
            try:
                await self.channel.status(egress, timeout_s=1.0)
                return
            except EgressUnavailable:
                now = time.monotonic()
                failed = now - started > timeout_s
                if not failed and now - checked > 1.0:
                    checked = now
                    failed = await asyncio.to_thread(self.provision.failed_blocking, egress.session_id)
                if failed:
                    logs = await asyncio.to_thread(self.provision.logs_blocking, egress.session_id, 20)
                    raise EgressUnavailable(f"egress proxy {egress.proxy_name} did not come up:\n{logs}") from None
                await asyncio.sleep(0.05)

    async def check_replay(self, egress: Egress) -> int:
        """A hermetic proxy's recorded responses are loaded; returns how many (ReplayUnreadable if not)."""
        replay = (await self.channel.status(egress)).replay
        if replay is not None and replay.error:
            raise ReplayUnreadable(replay.error)
        return replay.flows if replay is not None else 0

    def discard_blocking(self, prepared: Prepared) -> None:
        """Undo :meth:`prepare_blocking` (and a proxy it may have started) for a start that failed:
        no session came of it, so nothing of it is kept."""
        self.provision.remove_egress_blocking(prepared.session_id)
        self.forget_blocking(prepared.session_id)

    def forget_blocking(self, session_id: str) -> None:
        """Everything of a session that never was one (its start failed before its token was
        returned, so nobody can ask for its log). Its proxy and network must be gone already."""
        self.provision.forget_blocking(session_id)
        self.channel.forget(session_id)
        self.mirror.forget(session_id)

    def teardown_blocking(self, egress: Egress, anchor: bool = True) -> None:
        """Remove the proxy and the network, its chain's head anchored first (not ``anchor``: a paused
        session's stopped proxy, anchored as it paused); the state (audit log) stays."""
        if anchor:
            self.channel.anchor_end_blocking(egress)
            self.mirror.follow_blocking(egress, final=True)  # up to the anchored head, before the proxy goes
        self.provision.remove_blocking(egress)
        self.ledger.forget(egress.session_id)
        self.channel.forget(egress.session_id)
        self.mirror.forget(egress.session_id)

    def pause_blocking(self, egress: Egress) -> None:
        """A paused session's proxy: its chain's head anchored, then stopped (container, network,
        state and CA kept: :meth:`resume_blocking` starts it again and its chain carries on)."""
        self.channel.anchor_end_blocking(egress)
        self.mirror.follow_blocking(egress, final=True)  # a stopped proxy's tmpfs is gone at its start
        self.provision.stop_blocking(egress.session_id)

    def resume_blocking(self, egress: Egress) -> Egress:
        """The paused session's proxy started again: the pair with its address as it is now."""
        restarted = self.provision.restart_blocking(egress)
        self.mirror.restarted(egress.session_id)  # its state is the copy's now: followed on from it
        return restarted

    def sandbox_side(self, egress: Egress) -> tuple[dict[str, str], dict[str, str]]:
        """What a new sandbox of this session is given: environment (its CA) and files (its token)."""
        return self.provision.sandbox_side(egress.session_id)

    async def revive(
        self, egresses: list[Egress], states: Mapping[str, State] | None = None
    ) -> tuple[dict[str, Egress], list[str]]:
        """Restart every proxy that is not running (its sandbox has no egress meanwhile).

        ``states`` is the instance's proxies by session, when the caller listed them already (the
        reaper's tick lists them once for the pool and this): every one of ``egresses`` must have
        existed before that listing, or it would read as gone. None: listed here.

        Returns the restarted ones (by session, with their address as it is now) and the sessions
        whose proxy is gone altogether, which the caller ends: no proxy, no session.
        """
        if not egresses:
            return {}, []
        if states is None:
            states = await asyncio.to_thread(self.provision.proxy_states_blocking)
        # The running ones: policy checked, chain head anchored, state mirrored (all at once, each
        # with a short timeout).
        running = [e for e in egresses if states.get(e.session_id) == "running"]
        await asyncio.gather(*(self.watch.check_quietly(e) for e in running), *(self.mirror.follow(e) for e in running))
        revived: dict[str, Egress] = {}
        gone: list[str] = []
        for egress in egresses:
            state = states.get(egress.session_id)
            if state in PROXY_BUSY_STATES:
                continue
            if state is None:
                log.error("egress proxy %s is gone; ending session %s", egress.proxy_name, egress.session_id)
                gone.append(egress.session_id)
                continue
            log.warning("egress proxy %s is %s; restarting it", egress.proxy_name, state)
            try:
                revived[egress.session_id] = await asyncio.to_thread(self.provision.restart_blocking, egress)
                self.mirror.restarted(egress.session_id)  # seeded from the copy: followed on from it
            except SandboxError as exc:
                log.error("cannot restart egress proxy %s: %s", egress.proxy_name, exc)
        return revived, gone

    # -- the control channel --------------------------------------------------------------------------

    async def status(self, egress: Egress, timeout_s: float = 5.0) -> Reply:
        return await self.channel.status(egress, timeout_s)

    async def report(self, egress: Egress, message: GatewayEvent) -> None:
        await self.channel.report(egress, message)

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> Reply:
        return await self.channel.set_policy(egress, allow, mode, actor)

    async def set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> Reply:
        return await self.channel.set_secrets(egress, secret_set, actor)

    def record_start(self, session_id: str, allow: list[str], mode: str) -> None:
        self.ledger.record_start(session_id, allow, mode)

    def expected(self, session_id: str) -> PolicyView | None:
        return self.ledger.expected(session_id)

    async def check(self, egress: Egress) -> bool:
        return await self.watch.check(egress)

    async def mirror_now(self, session_id: str, egress: Egress | None) -> None:
        """Before a read of the session's audit log: the proxy's records so far copied in, where the
        runtime shares no directory with it (nothing otherwise, or for a session without a proxy)."""
        if egress is not None and egress.session_id == session_id:
            await self.mirror.follow(egress, wait=True)

    # -- archive --------------------------------------------------------------------------------------

    def write_meta(self, session_id: str, **fields: object) -> None:
        self.archive.write_meta(session_id, **fields)

    def meta(self, session_id: str) -> SessionMeta | None:
        return self.archive.meta(session_id)

    def logs(self, owner: str) -> list[AuditLogEntry]:
        return self.archive.logs(owner)

    def prune(self, retention_s: float, live: set[str]) -> int:
        return self.archive.prune(retention_s, live)
