"""Cold starts: a sandbox made ready, alone (:class:`SandboxStarts`, a gateway without egress control)
or with its egress proxy on its own network (:class:`PairStarts`); and their removal. The wiring
(corral.gateway.app) chooses one; the rest of the session side sees :class:`Starts` only.

Cancelled anywhere (a gateway stopping mid-refill), a start waits for its threads and removes what
they made before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from corral.errors import EgressOff, EgressUnavailable, GroundProxyLost, HermeticUnavailable
from corral.gateway.egress import Egress, EgressManager, Ground, Prepared
from corral.gateway.grounds import GroundPool
from corral.gateway.limits import Limits
from corral.gateway.models import CreateSession, Viewport
from corral.gateway.sessions.records import GATEWAY_LABEL, KIND_LABEL, Pair, new_session_id
from corral.gateway.settings import GatewaySettings
from corral.gateway.threads import in_thread, settle
from corral.runtime import SandboxAddress, SandboxRuntime, SandboxSpec, SessionNetwork

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartAsk:
    """What one cold start of a pair was asked for (:meth:`PairStarts.start`'s arguments, kept for
    its retry without a ground)."""

    kind: str
    viewport: Viewport
    req: CreateSession | None
    allow: tuple[str, ...]
    mode: str
    replay: Path | None
    actor: str
    workspace: Path | None
    image: str | None


class Specs:
    """The sandbox's container spec, from the settings, the host's limits and the request."""

    def __init__(self, settings: GatewaySettings, limits: Limits) -> None:
        self._settings = settings
        self._limits = limits

    def labels(self, kind: str) -> dict[str, str]:
        return {GATEWAY_LABEL: self._settings.instance, KIND_LABEL: kind}

    def instance_labels(self) -> dict[str, str]:
        """This gateway instance's label alone: what it lists and reclaims by."""
        return {GATEWAY_LABEL: self._settings.instance}

    def sandbox(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        network: SessionNetwork | None = None,
        environment: dict[str, str] | None = None,
        files: dict[str, str] | None = None,
        workspace: Path | None = None,
        image: str | None = None,
    ) -> SandboxSpec:
        s = self._settings
        res = req.resources if req is not None else None
        cpus = min(res.cpus, s.max_cpus) if res and res.cpus else self._limits.cpus
        memory = min(res.memory_mb, s.max_memory_mb) if res and res.memory_mb else self._limits.memory_mb
        disk = min(res.disk_mb, s.max_disk_mb) if res and res.disk_mb else s.default_disk_mb
        return SandboxSpec(
            image=image or s.image,  # a template's checked image (by id), else the base
            screen=f"{viewport.width}x{viewport.height}",
            name=f"corral-{kind}-{secrets.token_hex(4)}",
            memory=f"{memory}m",
            cpus=cpus,
            pids=s.default_pids,
            shm_size=f"{s.default_shm_mb}m",
            tmp_size=f"{disk}m",
            workspace_size=s.workspace_size,
            workspace_mount=str(workspace) if workspace is not None else None,
            labels=self.labels(kind),
            network=s.network,
            session_network=network,
            environment={**s.download_environment(), **self.recording_environment(), **(environment or {})},
            files=files,
        )

    def recording_environment(self) -> dict[str, str]:
        """A gateway that does not record tells its sandboxes so: their controllers keep no events
        (a redaction, a frame task and a DevTools read of the page's title after every request, for
        nobody to fetch: docs/design/0451)."""
        return {} if self._settings.record else {"CORRAL_RECORD": "0"}


class Starts(Protocol):
    def refuse(self, req: CreateSession) -> None:
        """Raises for what the request asks that these starts cannot give."""

    async def start(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        allow: Sequence[str],
        mode: str,
        replay: Path | None = None,
        actor: str = "gateway",
        workspace: Path | None = None,
        image: str | None = None,
    ) -> Pair:
        """A ready pair (its policy, if it has a proxy, in force), or raises having removed all of it.
        ``workspace``: a volume's host mount, the sandbox's /workspace."""

    async def remove(self, pair: Pair, started: bool = True) -> None:
        """Remove a pair's containers and network; one that never ``started`` (it did not come up)
        keeps nothing on disk either: no session came of it."""

    async def remove_unowned(self, owned: set[str]) -> None:
        """At start: the egress pairs of this instance that no adopted session owns."""

    def open(self) -> None:
        """Begin making grounds ahead (after the orphan networks went: its networks are no orphans)."""

    async def close(self) -> None:
        """Drop the grounds no session took: their networks and state go."""

    def held_grounds(self) -> list[Ground]:
        """The grounds made ahead and held now (not to be taken: for the reaper's and pruning's bookkeeping)."""

    def retire_grounds(self, dead: list[Ground]) -> None:
        """Held grounds found broken: dropped and made again."""


async def remove_failed_start(remove: Callable[[Pair, bool], Awaitable[None]], pair: Pair) -> None:
    """What a start that failed made, removed before its failure goes on (``remove(pair, started=False)``).
    A removal that fails is said here: nothing else would (only a gateway's restart removes what is
    left unowned), and a lost ground's retry starts another pair anyway. A cancellation that comes
    during the removal is raised once it is done (see PairStarts._start_pair)."""
    (removed,), stopped = await settle(asyncio.ensure_future(remove(pair, False)))
    if isinstance(removed, BaseException):
        log.error("could not remove what the start of %s made: %s", pair.session_id, removed)
    if stopped:
        raise asyncio.CancelledError from None


class SandboxStarts:
    """A sandbox alone: no proxy, no network of its own."""

    def __init__(self, settings: GatewaySettings, runtime: SandboxRuntime, specs: Specs) -> None:
        self._settings, self._runtime, self._specs = settings, runtime, specs

    def refuse(self, req: CreateSession) -> None:
        if req.secrets:
            raise EgressOff("secrets need egress control, which this gateway runs without")
        if req.hermetic is not None:
            raise HermeticUnavailable("hermetic replays need egress control, which this gateway runs without")

    async def start(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        allow: Sequence[str],
        mode: str,
        replay: Path | None = None,
        actor: str = "gateway",
        workspace: Path | None = None,
        image: str | None = None,
    ) -> Pair:
        spec = self._specs.sandbox(kind, viewport, req, workspace=workspace, image=image)
        (started,), cancelled = await settle(in_thread(self._runtime.start_sandbox, spec))
        if isinstance(started, BaseException):
            raise started
        if cancelled:
            await settle(in_thread(self._runtime.remove, started.id))
            raise asyncio.CancelledError
        pair = Pair(new_session_id(), started, None)
        try:
            await asyncio.to_thread(self._runtime.wait_ready, pair.sandbox, self._settings.start_timeout_s)
        except BaseException:
            await remove_failed_start(self.remove, pair)
            raise
        return pair

    async def remove(self, pair: Pair, started: bool = True) -> None:
        await asyncio.to_thread(self._runtime.remove, pair.sandbox.id)

    async def remove_unowned(self, owned: set[str]) -> None:
        return None  # no egress pairs are started here

    def open(self) -> None:
        return None  # no grounds: a sandbox alone needs none

    async def close(self) -> None:
        return None

    def held_grounds(self) -> list[Ground]:
        return []

    def retire_grounds(self, dead: list[Ground]) -> None:
        return None


async def _already(egress: Egress) -> Egress:
    return egress


class PairStarts:
    """A sandbox and its egress proxy. Network and CA first (made ahead when the ground pool holds
    one); then the proxy and the sandbox start side by side (the sandbox's firewall refuses everything
    but the proxy until the proxy answers), or the sandbox alone when the ground's proxy was started ahead."""

    def __init__(
        self, settings: GatewaySettings, runtime: SandboxRuntime, specs: Specs, egress: EgressManager, grounds: int
    ) -> None:
        self._settings, self._runtime, self._specs, self._egress = settings, runtime, specs, egress
        # Session networks and CAs made ahead: a cold start takes one rather than wait for Docker to make it.
        self.grounds: GroundPool[Ground] = GroundPool(
            self.make_ground, self.drop_ground, grounds, fresh=self.ground_fresh
        )

    def refuse(self, req: CreateSession) -> None:
        return None  # secrets and hermetic replays are what egress control is for

    def make_ground(self) -> Ground:
        # The instance's label alone, no corral.kind: Docker cannot relabel a network, and the session
        # or pooled pair that takes it is not known yet; a kind of "ground" would still say "unclaimed"
        # once claimed. Which grounds are unclaimed is said by the gateway's markers only
        # (EgressManager.unclaimed_grounds); orphan cleanup goes by the live sessions' networks.
        labels = self._specs.instance_labels()
        return self._egress.make_ground_blocking(new_session_id(), labels, proxy=self._settings.ground_proxies)

    def drop_ground(self, ground: Ground) -> None:
        self._egress.drop_ground_blocking(ground)

    def ground_fresh(self, ground: Ground) -> bool:
        return self._egress.ground_fresh(ground)

    def open(self) -> None:
        self.grounds.start()

    async def close(self) -> None:
        await self.grounds.close()

    def held_grounds(self) -> list[Ground]:
        return self.grounds.held()

    def retire_grounds(self, dead: list[Ground]) -> None:
        self.grounds.retire(dead)

    async def start(
        self,
        kind: str,
        viewport: Viewport,
        req: CreateSession | None,
        allow: Sequence[str],
        mode: str,
        replay: Path | None = None,
        actor: str = "gateway",
        workspace: Path | None = None,
        image: str | None = None,
    ) -> Pair:
        ask = StartAsk(kind, viewport, req, tuple(allow), mode, replay, actor, workspace, image)
        try:
            return await self._start_once(ask, take_ground=True)
        except GroundProxyLost as lost:
            # A ground is a head start, never a reason to fail: its proxy, started ahead, went with its
            # machine (a swarm node lost before the reaper's listing saw it) or stopped answering.
            # What the start made is gone (_start_once removed it); the session starts again with a
            # proxy of its own, on a machine that takes sessions now (docs/design/0465).
            log.warning("%s; starting the session with a proxy of its own", lost)
            return await self._start_once(ask, take_ground=False)

    async def _start_once(self, ask: StartAsk, take_ground: bool) -> Pair:
        allow, mode, replay = ask.allow, ask.mode, ask.replay
        try:
            pair, egress, ahead = await self._start_pair(ask, take_ground)
        except BaseException:
            self.grounds.refill()
            raise
        try:
            timeout_s = self._settings.start_timeout_s
            sandbox_ready = asyncio.to_thread(self._runtime.wait_ready, pair.sandbox, timeout_s)
            # Either way the session's policy is in force before this returns (and the token with it).
            proxy_ready = (
                self._ground_policy(egress, [*allow], mode, ask.actor, timeout_s)
                if ahead
                else self._egress.wait_ready(egress, timeout_s)
            )
            await asyncio.gather(sandbox_ready, proxy_ready)
            if replay is not None:
                await self._egress.check_replay(egress)  # a hermetic session that cannot answer fails here
        except BaseException:
            await remove_failed_start(self.remove, pair)
            raise
        finally:
            # After a start, not during it: making a network is Docker's work, and Docker and the CPUs
            # are busy with the start's containers until the sandbox answers.
            self.grounds.refill()
        return pair

    async def _ground_policy(self, egress: Egress, allow: list[str], mode: str, actor: str, timeout_s: float) -> None:
        """The session's policy on its ground's proxy; GroundProxyLost when that proxy never answers."""
        try:
            await self._egress.set_start_policy(egress, allow, mode, actor, timeout_s)
        except EgressUnavailable as exc:
            raise GroundProxyLost(
                f"the proxy started ahead for ground {egress.session_id} does not answer: {exc}"
            ) from exc

    async def _start_pair(self, ask: StartAsk, take_ground: bool) -> tuple[Pair, Egress, bool]:
        """The pair, its egress, and whether its proxy was started ahead (its policy is still to be set)."""
        kind, allow, mode, replay = ask.kind, ask.allow, ask.mode, ask.replay
        egress_manager = self._egress
        ground = self.grounds.take() if take_ground else None
        session_id = ground.session_id if ground is not None else new_session_id()
        labels = self._specs.labels(kind)
        (prepared,), cancelled = await settle(
            in_thread(egress_manager.prepare_blocking, session_id, [*allow], mode, labels, replay, ground)
        )
        if isinstance(prepared, BaseException):
            raise prepared
        if cancelled:
            await settle(in_thread(egress_manager.discard_blocking, prepared))
            raise asyncio.CancelledError
        spec = self._specs.sandbox(
            kind,
            ask.viewport,
            ask.req,
            prepared.network,
            prepared.sandbox_env,
            prepared.sandbox_files,
            ask.workspace,
            ask.image,
        )
        proxy_start: Awaitable[Egress] = (
            in_thread(egress_manager.start_proxy_blocking, prepared)
            if prepared.egress is None
            else _already(prepared.egress)  # started ahead with the ground
        )
        (egress, started), cancelled = await settle(proxy_start, in_thread(self._runtime.start_sandbox, spec))
        if isinstance(egress, Egress) and isinstance(started, SandboxAddress) and not cancelled:
            return Pair(session_id, started, egress), egress, prepared.egress is not None
        sandbox = started if isinstance(started, SandboxAddress) else None
        (undone,), stopped = await settle(asyncio.ensure_future(self._undo(prepared, sandbox)))
        if isinstance(undone, BaseException):
            # Said here: nothing else would (a refill stopped midway once left its network behind unseen).
            log.error("could not remove what the start of %s made: %s", session_id, undone)
        if cancelled or stopped:
            # A cancellation during the undo of a failed start too (settle took it): raised as the
            # failure instead, it was lost, and a stopping gateway's refill loop retried the start.
            raise asyncio.CancelledError
        failure = egress if isinstance(egress, BaseException) else started
        assert isinstance(failure, BaseException)  # not both started, not cancelled: one of them failed
        raise failure

    async def _undo(self, prepared: Prepared, sandbox: SandboxAddress | None) -> None:
        """What :meth:`_start_pair` made, for a start that failed or was cancelled: the sandbox first,
        then the proxy (by name) and the network. Not side by side: Docker refuses to remove a network
        a container is still on ("has active endpoints"), and a sandbox being removed still is until
        its removal returns, so a stop in the middle of a refill once left the refill's network."""
        try:
            if sandbox is not None:
                await asyncio.to_thread(self._runtime.remove, sandbox.id)
        finally:
            await asyncio.to_thread(self._egress.discard_blocking, prepared)

    async def remove(self, pair: Pair, started: bool = True) -> None:
        await asyncio.to_thread(self._runtime.remove, pair.sandbox.id)
        if pair.egress is not None:  # a pooled pair of an older start may have none
            # A start that failed anchors nothing: its state goes next, and its proxy (a lost ground's)
            # may not answer, which the anchor and the final mirror pass would each wait out.
            await asyncio.to_thread(self._egress.teardown_blocking, pair.egress, started)
            if not started:
                await asyncio.to_thread(self._egress.forget_blocking, pair.session_id)

    async def remove_unowned(self, owned: set[str]) -> None:
        states = await asyncio.to_thread(self._runtime.proxy_states, self._specs.instance_labels())
        for session_id in states:
            if session_id not in owned:
                log.info("removing the unowned egress pair of %s", session_id)
                await asyncio.to_thread(self._runtime.remove_egress, session_id)
