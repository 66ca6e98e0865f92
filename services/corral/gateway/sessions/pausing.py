"""Pause and resume (E2B's pause/resume, Daytona's stop/start), without process snapshots: a pause
saves the session's state (its tabs, ``/workspace`` and ``/home/agent``, the browser's state through
its seam) out of the sandbox, removes the sandbox and stops its proxy (network, state, CA and audit
chain kept), and frees its slot; a resume starts a new sandbox for the same id on the same network,
starts the proxy again (its chain carries on), sets the policy and the secrets, puts the state back,
and gives the same token its session again. Its remaining wall-clock time does not run while paused.

States: ready -> pausing -> paused -> resuming -> ready; a failed pause goes back to ready, a failed
resume back to paused (what it started removed). A paused session's WebSockets were closed with
CLOSE_PAUSED; everything that would reach its sandbox answers SessionPaused (409)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from corral.contracts.control import SessionEvent
from corral.errors import PausedCapacityError, SecretsMissing, SessionNotFound, SessionNotPaused
from corral.gateway.egress import Egress
from corral.gateway.models import CreateSession, ResumeSession
from corral.gateway.secrets import SecretSet
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.brokering import SecretBroker
from corral.gateway.sessions.claims import Claims
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.envs import SessionEnvs
from corral.gateway.sessions.pausedstate import PausedState
from corral.gateway.sessions.records import Pair, Session, SessionRecord
from corral.gateway.sessions.savedstate import BrowserState, SavedState
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Specs
from corral.gateway.sessions.templatepools import TemplatePools
from corral.gateway.settings import GatewaySettings
from corral.gateway.threads import in_thread, settle
from corral.gateway.volumes import Volumes
from corral.runtime import SandboxAddress, SandboxRuntime, SessionNetwork

log = logging.getLogger(__name__)

SAVED_DIRS = ("/workspace", "/home/agent")
ACTOR = "owner"


class Pauses:
    def __init__(
        self,
        settings: GatewaySettings,
        book: SessionBook,
        runtime: SandboxRuntime,
        egress: EgressPort,
        specs: Specs,
        parts: PauseParts,
    ) -> None:
        self._settings, self._book, self._runtime, self._egress, self._specs = settings, book, runtime, egress, specs
        self._saved, self._browser, self._claims = parts.saved, parts.browser, parts.claims
        self._broker, self._recordings = parts.broker, parts.recordings
        self._volumes, self._envs, self._templates = parts.volumes, parts.envs, parts.templates
        self._tasks: set[asyncio.Task[None]] = set()

    # -- pause -----------------------------------------------------------------------------------------

    def _admit_pause(self, session: Session) -> None:
        if session.state == "stopping":
            raise SessionNotFound(f"no session {session.id}")
        if session.state != "ready":
            raise SessionNotPaused(f"session {session.id} is {session.state}: only a running session pauses")
        s = self._settings
        paused = [x for x in self._book.sessions() if x.paused]
        if len(paused) >= s.max_paused:
            raise PausedCapacityError(
                f"{len(paused)} sessions are paused, the limit (CORRAL_MAX_PAUSED={s.max_paused})"
            )
        mine = sum(1 for x in paused if x.owner == session.owner)
        if mine >= s.max_paused_per_key:
            raise PausedCapacityError(
                f"this API key has {mine} paused sessions, its limit (CORRAL_MAX_PAUSED_PER_KEY={s.max_paused_per_key})"
            )

    async def pause(self, session: Session) -> PausedState:
        async with session.changing:
            self._admit_pause(session)  # before still_live, which takes any state but ready for gone
            self._book.still_live(session)
            session.state = "pausing"
            session.ended.set()  # its WebSockets close now, with CLOSE_PAUSED and why
            try:
                state = await self._save(session)
                await self._audit(session, "pause", state)
            except BaseException:
                self._saved.remove(session.id)
                self._browser.discard(session.id)
                if _still_ours(session, "ready"):
                    session.ended = asyncio.Event()
                raise
            # Saved and audited: from here it is paused, whatever fails below (each step logged, none
            # leaving it stuck "pausing": a sandbox not removed is an unowned one, which a restarted
            # gateway removes; a proxy not stopped is stopped again by the resume's restart).
            session.record = session.record.model_copy(update={"paused": state, "paused_at": state.paused_at})
            await self._quietly("its recording's pause event", self._recordings.pause(session.id, state))
            await self._quietly("its sandbox's removal", asyncio.to_thread(self._runtime.remove, session.sandbox.id))
            if self._volumes is not None:  # its sandbox is gone: unmounted, still its session's
                await self._quietly("its volume's unmount", self._volumes.suspend(session.id))
            if session.egress is not None:
                await self._quietly("its proxy's stop", asyncio.to_thread(self._egress.pause_blocking, session.egress))
            if _still_ours(session, "paused"):
                self._book.save(session)
            log.info("session %s paused (%s)", session.id, state.archives)
            return state

    @staticmethod
    async def _quietly(what: str, step: Awaitable[object]) -> None:
        try:
            await step
        except Exception as exc:
            log.warning("pause: %s failed: %s", what, exc)

    async def _save(self, session: Session) -> PausedState:
        sandbox, now = session.sandbox, time.time()
        tabs = await self._saved.tabs(sandbox)
        archives: dict[str, int] = {}
        for path in self.saved_dirs(session):
            archives[path] = await self._saved.save_dir(session.id, sandbox, path)
        browser = await self._browser.export(session.id, sandbox)  # the browser-profiles seam
        remaining = max(0.0, session.record.expires_at - now)
        return PausedState(paused_at=now, remaining_s=remaining, tabs=tabs, archives=archives, browser_bytes=browser)

    async def _audit(self, session: Session, change: str, state: PausedState) -> None:
        """The pause into the session's audit chain, before its proxy stops (sizes, never contents).
        A proxy that does not take it fails the pause: no pause goes unaudited."""
        if session.egress is not None:
            await self._egress.report(session.egress, session_event(change, state))

    @staticmethod
    def saved_dirs(session: Session) -> tuple[str, ...]:
        # A session on a workspace volume keeps holding it while paused: its /workspace is not archived.
        return tuple(d for d in SAVED_DIRS if not (session.record.volume and d == "/workspace"))

    def pause_soon(self, session: Session) -> None:
        """The idle timeout's pause (``idle_action: pause``), by a kept task; one that fails ends it."""

        async def run() -> None:
            try:
                await self.pause(session)
            except Exception as exc:
                log.warning("idle pause of %s failed (%s); it runs on", session.id, exc)
                session.touch()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- resume ----------------------------------------------------------------------------------------

    async def resume(self, session: Session, body: ResumeSession) -> None:
        async with session.changing:
            if session.state != "paused" or session.record.paused is None:
                raise SessionNotPaused(f"session {session.id} is {session.state}: only a paused session resumes")
            secret_set = self._secrets(session, body)
            await self._claims.hold_slot(session.owner)
            session.state = "resuming"
            try:
                await self._restart(session, session.record.paused, secret_set)
            except BaseException:
                _still_ours(session, "paused")
                raise
            finally:
                await self._claims.release_slot(session.owner)

    def _secrets(self, session: Session, body: ResumeSession) -> SecretSet:
        """Its secret set with every value: held by the vault, or given again in the body (a restarted
        gateway lost them: SecretsMissing names those still missing)."""
        records = session.record.secrets
        if not records:
            return SecretSet()
        held = self._egress.vault.get(session.id)
        values = {n: v for n, v in held.values.items() if n in records}
        # Only what the vault lost: replacing a held value is PATCH's (audited as a change, owner only).
        values.update({n: v for n, v in body.secrets.items() if n in records and n not in values})
        missing = sorted(set(records) - set(values))
        if missing:
            raise SecretsMissing(
                "the gateway restarted while the session was paused and holds no value of "
                + ", ".join(missing)
                + ": give them in the resume body's secrets"
            )
        return SecretSet(dict(records), values)

    async def _image(self, record: SessionRecord) -> str | None:
        """The checked image of the template it started from (None: the base): a template deleted or
        rebuilt on another base meanwhile refuses the resume, naming it (TemplateNotFound, TemplateStale)."""
        if record.template is None:
            return None
        return (await asyncio.to_thread(self._templates.resolve, record.template)).image_id

    async def _start_pair(self, record: SessionRecord, image: str | None, workspace: Path | None) -> Pair:
        """Its proxy started again beside a new sandbox on its network, side by side as a cold start's
        (the sandbox's firewall lets nothing out but to the proxy); whatever started is undone on failure."""
        old, env, files = record.egress, None, None
        if old is not None:
            env, files = await asyncio.to_thread(self._egress.sandbox_side, old)
        network = SessionNetwork(old.network, old.subnet, old.gateway) if old is not None else None
        asked = CreateSession(resources=record.resources) if record.resources is not None else None
        spec = self._specs.sandbox(
            "session", record.viewport, asked, network, env, files, workspace=workspace, image=image
        )
        proxy = in_thread(self._egress.resume_blocking, old) if old is not None else _nothing()
        (proxy_result, sandbox), cancelled = await settle(proxy, in_thread(self._runtime.start_sandbox, spec))
        egress = proxy_result if isinstance(proxy_result, Egress) else None
        failed = [r for r in (proxy_result, sandbox) if isinstance(r, BaseException)]
        if not failed and isinstance(sandbox, SandboxAddress) and not cancelled:
            return Pair(record.id, sandbox, egress)
        if isinstance(sandbox, SandboxAddress):
            await settle(in_thread(self._runtime.remove, sandbox.id))
        if egress is not None:
            await settle(in_thread(self._egress.pause_blocking, egress))
        if cancelled or not failed:
            raise asyncio.CancelledError
        raise failed[0]

    async def _egress_ready(self, record: SessionRecord, egress: Egress | None, state: PausedState) -> None:
        """The restarted proxy answers, holds the session's policy, and has the resume in its chain."""
        if egress is None:
            return
        await self._egress.wait_ready(egress, self._settings.start_timeout_s)
        await self._egress.set_policy(egress, list(record.allow), record.egress_mode or "enforce", ACTOR)
        await self._egress.report(egress, session_event("resume", state))

    async def _restore_browser(self, session_id: str, sandbox: SandboxAddress, state: PausedState) -> None:
        await self._browser.restore(session_id, sandbox)  # the browser-profiles seam: cookies before pages
        await self._saved.open_tabs(sandbox, state.tabs)

    async def _restart(self, session: Session, state: PausedState, secret_set: SecretSet) -> None:
        record = session.record
        image = await self._image(record)  # before anything starts: a missing template says so
        workspace = await self._volumes.resume(session.id) if self._volumes is not None else None
        try:
            pair = await self._start_pair(record, image, workspace)
        except BaseException:
            if self._volumes is not None:
                await settle(asyncio.ensure_future(self._volumes.suspend(session.id)))
            raise
        sandbox, egress = pair.sandbox, pair.egress
        try:
            sandbox_ready = asyncio.to_thread(self._runtime.wait_ready, sandbox, self._settings.start_timeout_s)
            await asyncio.gather(sandbox_ready, self._egress_ready(record, egress, state))
            if record.env_values:  # its env, as at its create (the new controller starts with none)
                await self._envs.give(sandbox, record.env_values)
            if egress is not None and secret_set.records:
                await self._broker.give(pair, secret_set, SecretSet(), ACTOR)  # placeholders to the controller
            # Side by side: the files (an upload and a tar each) and the browser (its state, then its tabs).
            restores = [self._saved.restore_dir(session.id, sandbox, path) for path in self.saved_dirs(session)]
            await asyncio.gather(*restores, self._restore_browser(session.id, sandbox, state))
        except BaseException:
            await settle(asyncio.ensure_future(asyncio.to_thread(self._runtime.remove, sandbox.id)))
            if self._volumes is not None:
                await settle(asyncio.ensure_future(self._volumes.suspend(session.id)))
            if egress is not None:
                await settle(asyncio.ensure_future(asyncio.to_thread(self._egress.pause_blocking, egress)))
            raise
        now = time.time()
        session.record = record.model_copy(
            update={
                "container": sandbox.id,
                "egress": egress,
                "expires_at": now + state.remaining_s,
                "paused": None,
                "paused_at": None,
            }
        )
        session.sandbox = sandbox  # an end that came meanwhile removes this one
        self._saved.remove(session.id)
        self._browser.discard(session.id)
        if not _still_ours(session, "ready"):
            return
        session.ended = asyncio.Event()
        session.touch()
        self._book.save(session)
        self._recordings.resume(session, state)
        log.info("session %s resumed in %s", session.id, sandbox.name)

    # -- expiry ----------------------------------------------------------------------------------------

    def expired(self, session: Session, now: float) -> bool:
        paused = session.record.paused
        return (
            session.state == "paused" and paused is not None and now - paused.paused_at >= self._settings.paused_ttl_s
        )

    def sweep(self) -> None:
        """At a gateway's start, after the recovery: saved state no paused session owns removed."""
        gone = self._saved.sweep({s.id for s in self._book.sessions() if s.record.paused is not None})
        if gone:
            log.info("removed the saved state of %d sessions no longer paused: %s", len(gone), ", ".join(gone))

    def discard(self, session_id: str) -> None:
        """A paused session's saved state, at its end."""
        self._saved.remove(session_id)
        self._browser.discard(session_id)

    async def settled(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _nothing() -> None:
    return None


def _still_ours(session: Session, state: str) -> bool:
    """The session turns ``state``, unless it was ended meanwhile (a DELETE, an expiry, waiting on
    its lock): that end goes on, and the state it set stays."""
    if session.state == "stopping":
        return False
    session.state = state
    return True


def session_event(change: str, state: PausedState) -> SessionEvent:
    return SessionEvent(change, ACTOR, tuple(state.archives.items()), len(state.tabs))


@dataclass(frozen=True, slots=True)
class PauseParts:
    """What pause and resume hand work to: the saved files and tabs, the browser's state (the
    browser-profiles seam), the slot, the secrets, the recording, the workspace volume it keeps
    holding, its env given again, the template it resumes from."""

    saved: SavedState
    browser: BrowserState
    claims: Claims
    broker: SecretBroker
    recordings: SessionRecordings
    envs: SessionEnvs
    templates: TemplatePools
    volumes: Volumes | None = None
