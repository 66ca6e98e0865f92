"""What the gateway tells a running proxy over its control channel (corral.contracts.control): its
policy and secrets, its status, the gateway's own events; one conversation per proxy at a time.

The gateway never takes the proxy's word for its own state: every answer carries the policy's
generation and the chain's head, which the :class:`~.ledger.PolicyLedger` checks and anchors.
"""

from __future__ import annotations

import asyncio
import logging

from corral.contracts.control import GatewayEvent, Message, Reply, SetPolicy, Status
from corral.errors import ControlError, EgressUnavailable, InvalidMessage
from corral.gateway.secrets import SecretSet, SecretVault
from corral.proxy import control

from .ledger import PolicyLedger
from .pairs import POLL_TIMEOUT_S, Egress
from .state import ProxyTokens

log = logging.getLogger(__name__)


class ProxyChannel:
    """The gateway's side of each proxy's control channel."""

    def __init__(self, tokens: ProxyTokens, ledger: PolicyLedger, vault: SecretVault) -> None:
        self._tokens = tokens
        self._ledger = ledger
        self._vault = vault
        self.control_port = control.CONTROL_PORT
        self._locks: dict[str, asyncio.Lock] = {}  # one policy conversation per proxy at a time

    async def call(self, egress: Egress, message: Message, timeout_s: float = 5.0) -> Reply:
        """One message and its answer; EgressUnavailable when the proxy refused it or did not answer."""
        token = self._tokens.token(egress.session_id)
        try:
            return await control.call(egress.proxy_address, self.control_port, token, message, timeout_s)
        except ControlError as exc:
            raise EgressUnavailable(str(exc)) from None
        except InvalidMessage as exc:
            # An answer the typed Reply cannot read is the proxy's fault, not the caller's request's:
            # reported as the proxy being unusable (retried by wait_ready), never as invalid_field.
            raise EgressUnavailable(f"egress proxy gave a malformed answer: {exc}") from None

    def lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    def forget(self, session_id: str) -> None:
        """What this process holds of a session's conversations (its lock, its secrets)."""
        self._locks.pop(session_id, None)
        self._vault.forget(session_id)

    async def status(self, egress: Egress, timeout_s: float = 5.0) -> Reply:
        """The proxy's status; its chain head is anchored when it moved."""
        reply = await self.call(egress, Status(), timeout_s)
        self._ledger.observe(egress.session_id, reply, "poll")
        return reply

    async def report(self, egress: Egress, message: GatewayEvent) -> None:
        """One of the gateway's own events (a viewer link made, used, revoked, expired; a session's
        expiry changed; a volume claimed or released; a browser profile loaded or saved; a pause or resume) into the
        session's audit chain; raises EgressUnavailable when the proxy did not take it."""
        reply = await self.call(egress, message)
        self._ledger.observe(egress.session_id, reply, "poll")

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> Reply:
        """Swap the live policy; the proxy logs the change in the session's chain."""
        async with self.lock(egress.session_id):
            return await self.put_policy(egress, allow, mode, actor, "policy")

    async def put_policy(self, egress: Egress, allow: list[str], mode: str, actor: str, reason: str) -> Reply:
        """:meth:`set_policy` for a caller that holds the session's lock (``reason``: the anchor's)."""
        before = self._ledger.expected(egress.session_id)
        reply = await self.call(egress, SetPolicy(tuple(allow), mode, actor))
        generation = reply.generation or 0
        if before is not None and generation != before.generation + 1 and reason != "reassert":
            # The proxy counted a change the gateway did not make (since its last check).
            log.error(
                "egress policy of %s: the proxy's generation is %d after this change, the gateway's last was %d: "
                "someone else changed the proxy's policy",
                egress.session_id,
                generation,
                before.generation,
            )
        self._ledger.took(egress.session_id, reply, reason)
        return reply

    async def set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> Reply:
        """Set the session's whole secret set on its proxy (which logs the change, never a value); the
        vault takes it once the proxy did."""
        async with self.lock(egress.session_id):
            return await self.put_secrets(egress, secret_set, actor)

    async def put_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> Reply:
        """:meth:`set_secrets` for a caller that holds the session's lock."""
        try:
            reply = await self.call(egress, secret_set.message(actor))
        except EgressUnavailable:
            # The proxy applies a set whole or not at all, but its answer may be lost: when its status
            # shows the new set (names, and the digest of each value), the change took.
            status = await self._holding(egress, secret_set)
            if status is None:
                self._vault.send_failed(egress.session_id, secret_set)
                raise
            reply = status
            log.warning("egress proxy of %s took secrets %s; its answer was lost", egress.session_id, secret_set.names)
        self._ledger.observe(egress.session_id, reply, "poll")
        self._vault.keep(egress.session_id, secret_set)
        return reply

    async def _holding(self, egress: Egress, secret_set: SecretSet) -> Reply | None:
        """The proxy's status when it holds ``secret_set``; None when it does not or cannot say."""
        try:
            status = await self.call(egress, Status())
        except EgressUnavailable:
            return None
        held = status.secrets
        if held is not None and secret_set.held_by(held, self._tokens.token(egress.session_id)):
            return status
        return None

    def anchor_end_blocking(self, egress: Egress) -> None:
        """The chain's head at the session's end, from the proxy's memory (not its file, which a
        process with the proxy's uid could have changed), before the proxy goes (blocking)."""
        token = self._tokens.token(egress.session_id)
        try:
            reply = control.call_blocking(egress.proxy_address, self.control_port, token, Status(), POLL_TIMEOUT_S)
            self._ledger.observe(egress.session_id, reply, "end")
        except (ControlError, ValueError, KeyError, TypeError) as exc:
            # A dead proxy: its last anchor stands; verify says how many records come after it.
            log.warning("no final audit anchor for %s: %s", egress.session_id, exc)
