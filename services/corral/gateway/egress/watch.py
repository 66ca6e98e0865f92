"""The watchdog's look at a running proxy: its chain head anchored, its policy and secrets the ones
the gateway set (set again when they are not)."""

from __future__ import annotations

import logging

from corral.contracts.control import Head, Reply, SecretsState, Status
from corral.errors import EgressUnavailable
from corral.gateway.secrets import SecretVault

from .channel import ProxyChannel
from .ledger import PolicyLedger
from .pairs import POLL_TIMEOUT_S, REASSERT_ACTOR, Egress, PolicyView
from .state import ProxyTokens

log = logging.getLogger(__name__)


class ProxyWatch:
    """Holds each running proxy to what the gateway set."""

    def __init__(self, channel: ProxyChannel, ledger: PolicyLedger, vault: SecretVault, tokens: ProxyTokens) -> None:
        self._channel = channel
        self._ledger = ledger
        self._vault = vault
        self._tokens = tokens

    async def check(self, egress: Egress) -> bool:
        """The proxy's head anchored, its policy and secrets the gateway's.

        A generation or policy the gateway did not set means someone else holds the gateway's token
        (or wrote the proxy's policy file and restarted it): logged as an error, and the gateway's
        policy is set again at once (in the chain as a ``policy`` record by ``gateway:reassert``).
        Secrets the proxy lacks (it restarted, and keeps no values) are sent again the same way.
        Returns False when it had to do either.
        """
        async with self._channel.lock(egress.session_id):
            reply = await self._channel.call(egress, Status(), POLL_TIMEOUT_S)
            self._ledger.observe(egress.session_id, reply, "poll")
            if reply.head is None or reply.generation is None:
                return True  # a proxy from an image before policy generations: nothing to compare
            policy_held = await self._check_policy(egress, reply, reply.head)
            return await self._check_secrets(egress, reply.secrets) and policy_held

    async def check_quietly(self, egress: Egress) -> None:
        """:meth:`check`, its failures logged (the watchdog's round goes on)."""
        try:
            await self.check(egress)
        except EgressUnavailable as exc:
            log.debug("egress proxy %s not checked: %s", egress.proxy_name, exc)  # restarting; next round
        except (KeyError, ValueError, TypeError) as exc:
            log.error("egress proxy %s gave an answer without its policy or chain head: %r", egress.proxy_name, exc)

    async def _check_policy(self, egress: Egress, reply: Reply, head: Head) -> bool:
        live = PolicyView.from_reply(reply)
        expected = self._ledger.expected(egress.session_id)
        if expected is None:
            # A session from before anchors existed: nothing to hold the proxy to but itself.
            log.warning(
                "no policy on record for %s; taking the proxy's (generation %d)", egress.session_id, live.generation
            )
            self._ledger.expect(egress.session_id, live, "adopted", head.seq, head.hash)
            return True
        if live == expected:
            return True
        log.error(
            "egress policy of %s changed behind the gateway's back: the proxy runs generation %d (%s, %s), "
            "the gateway set generation %d (%s, %s); setting the gateway's policy again",
            egress.session_id,
            live.generation,
            live.mode,
            list(live.allow),
            expected.generation,
            expected.mode,
            list(expected.allow),
        )
        await self._channel.put_policy(egress, list(expected.allow), expected.mode, REASSERT_ACTOR, "reassert")
        return False

    async def _check_secrets(self, egress: Egress, status: SecretsState | None) -> bool:
        """The proxy holds the session's secrets (names, and the values the gateway holds, by their
        keyed digests), values loaded; else they are sent again. After a gateway restart the values
        it no longer has go without one (the proxy keeps its own); when the proxy lost them too,
        that is said once."""
        if status is None:
            return True  # a proxy from an image before secrets: the session has none
        session_id, key = egress.session_id, self._tokens.token(egress.session_id)
        expected = self._vault.get(session_id)
        held = expected.held_by(status, key)
        if held and (status.loaded is True or not status.names):
            return True
        pending = self._vault.pending(session_id)
        if pending is not None and pending.held_by(status, key):
            # A change whose answer was lost took after all: it is the session's now.
            log.warning(
                "egress proxy of %s holds secrets %s, a change whose answer was lost", session_id, list(status.names)
            )
            self._vault.keep(session_id, pending)
            return True
        if held and expected.missing_values():
            self._lost_values(session_id, list(status.names), expected.missing_values())
            return True
        log.warning(
            "egress proxy of %s holds secrets %s (values loaded: %s), not the set the gateway set (%s); "
            "sending them again",
            session_id,
            list(status.names),
            status.loaded,
            expected.names,
        )
        try:
            await self._channel.put_secrets(egress, expected, REASSERT_ACTOR)
        except EgressUnavailable as exc:
            log.error("egress proxy of %s did not take its secrets again: %s", session_id, exc)
        return False

    def _lost_values(self, session_id: str, names: list[str], missing: list[str]) -> None:
        """Said once: the proxy holds secrets without values, and this gateway holds none to send."""
        if self._vault.first_warning(session_id):
            log.warning(
                "egress proxy of %s holds secrets %s without values; this gateway restarted since they were "
                "set and holds no values for %s: requests using them are refused until the owner sets them "
                "again (PATCH /v1/sessions/%s)",
                session_id,
                names,
                missing,
                session_id,
            )
