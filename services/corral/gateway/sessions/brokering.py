"""A live session's egress changes and brokered secrets: its allowlist, mode and secrets changed on
its proxy (``PATCH``), the placeholders given to its controller, and the placeholder watchdog's round
that puts them back where a controller lost them. What a set is and how a change is planned is
corral.gateway.secrets'; this is the conversation with the proxy and the controller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

from corral.errors import EgressUnavailable, SandboxError
from corral.gateway.models import UpdateSecrets
from corral.gateway.secrets import SecretSet, plan_update
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.egressport import NO_EGRESS, EgressPort
from corral.gateway.sessions.records import Listing, Pair, Session

log = logging.getLogger(__name__)


class SecretBroker:
    def __init__(self, book: SessionBook, egress: EgressPort, controllers: Controllers, default_mode: str) -> None:
        self._book, self._egress, self._controllers = book, egress, controllers
        self._default_mode = default_mode

    async def update(
        self,
        session: Session,
        allow: Sequence[str] | None,
        mode: str | None,
        actor: str,
        secret_changes: UpdateSecrets | None = None,
    ) -> None:
        """Change a live session's allowlist, mode or secrets, validated whole before anything changes;
        the proxy logs each change in the audit chain. The policy goes first, then the secrets (see
        :meth:`give`); a step that fails undoes the ones before. A session being ended meanwhile (its
        end waits for this change) raises SessionNotFound and keeps nothing."""
        if session.egress is None:
            raise EgressUnavailable(NO_EGRESS)
        egress = session.egress
        async with session.changing:
            self._book.still_live(session)
            old_allow, old_mode = session.record.allow, session.record.egress_mode or self._default_mode
            new_allow = old_allow if allow is None else list(allow)
            new_mode = mode or old_mode
            current = self._egress.vault.get(session.id)
            planned = plan_update(current, secret_changes, new_allow, session.record.hermetic)
            if allow is not None or mode is not None or secret_changes is None:  # a PATCH of secrets alone leaves it
                await self._egress.set_policy(egress, new_allow, new_mode, actor)
                self._book.still_live(session)
            if secret_changes:
                try:
                    await self.give(Pair(session.id, session.sandbox, egress), planned, current, actor)
                    self._book.still_live(session)
                except BaseException:
                    if session.state == "ready" and (new_allow, new_mode) != (old_allow, old_mode):
                        await _undo(self._egress.set_policy(egress, old_allow, old_mode, actor), session.id)
                    self.record_held(session)
                    raise
            changed = {"allow": new_allow, "egress_mode": new_mode, "secrets": dict(planned.records)}
            session.record = session.record.model_copy(update=changed)
            self._book.save(session)

    async def give(self, pair: Pair, new: SecretSet, old: SecretSet, actor: str) -> None:
        """``new`` to the session's proxy, its placeholders to its controller (the agent's commands get
        them). The controller gets the old and the new placeholders first, so a failure there changes
        nothing; then the proxy takes the new set (whole or not at all); then the controller drops the
        old placeholders. A failure after the first step leaves only extra placeholders in the agent's
        environment, which the proxy refuses (revoked) or leaves alone (not yet added); the watchdog
        puts the right set again."""
        assert pair.egress is not None
        both = {**old.placeholders(), **new.placeholders()}
        await self._controllers.put_placeholders(pair.sandbox, both)
        await self._egress.set_secrets(pair.egress, new, actor)
        if both != new.placeholders():
            try:
                await self._controllers.put_placeholders(pair.sandbox, new.placeholders())
            except SandboxError as exc:
                log.warning("session %s: its controller keeps revoked placeholders for now: %s", pair.session_id, exc)

    def record_held(self, session: Session) -> None:
        """After a change failed part-way: the record says which secrets the proxy holds (the old
        ones, unless the proxy took the new set). Nothing is written for a session being ended."""
        held = dict(self._egress.vault.get(session.id).records)
        if held != session.record.secrets and session.state == "ready":
            log.warning("session %s: its proxy holds the secrets %s after a failed change", session.id, sorted(held))
            session.record = session.record.model_copy(update={"secrets": held})
            self._book.save(session)

    async def check_placeholders(self, listing: Listing | None = None) -> None:
        """The placeholder watchdog's round (one of the reaper's egress rounds; ``listing`` unused):
        every live session with secrets: its controller holds their placeholders, else it is given
        them again. A controller restarted inside its container starts with none (the agent's next
        commands would lack them), and one whose last PATCH failed after its first step keeps
        revoked ones. One signed GET per such session a round (sessions without secrets cost nothing):
        cheaper and surer than following the controller's boot id, which only a recording sees."""
        vault = self._egress.vault
        live = [s for s in self._book.ready() if s.record.secrets or vault.get(s.id).records or vault.pending(s.id)]
        await asyncio.gather(*(self._hold_placeholders(session) for session in live))

    async def _hold_placeholders(self, session: Session) -> None:
        if session.changing.locked():
            return  # a change under way puts them itself
        async with session.changing:
            if session.state != "ready":
                return
            self.record_held(session)  # the watchdog took a change whose answer was lost
            expected = SecretSet(session.record.secrets).placeholders()
            try:
                if await self._controllers.placeholders(session.sandbox) != expected:
                    log.warning(
                        "session %s: its controller lost its secrets' placeholders; putting them again", session.id
                    )
                    await self._controllers.put_placeholders(session.sandbox, expected)
            except SandboxError as exc:
                log.debug("session %s: placeholders not checked: %s", session.id, exc)  # next round


async def _undo(step: Awaitable[object], session_id: str) -> None:
    """One step of a failed change undone; its own failure is logged, the first one raised."""
    try:
        await step
    except Exception:
        log.exception("session %s: a failed change could not be undone", session_id)
