"""What the gateway holds each proxy to: the policy it last set (per session) and the audit chain's
heads, anchored in the gateway's :class:`~corral.gateway.anchors.AnchorBook`, outside every proxy's
reach, during the session and at its end."""

from __future__ import annotations

import logging

from corral.contracts.control import Reply
from corral.gateway.anchors import AnchorBook
from corral.proxy import audit

from .pairs import PolicyView, canonical_allow

log = logging.getLogger(__name__)


class PolicyLedger:
    """The policies the gateway set and the chain heads it saw, per session."""

    def __init__(self, anchors: AnchorBook) -> None:
        self.anchors = anchors
        self._expected: dict[str, PolicyView] = {}  # the policy the gateway last set, per session

    def record_start(self, session_id: str, allow: list[str], mode: str) -> None:
        """The policy a new proxy starts with (generation 0), kept where the proxy cannot write."""
        self.expect(session_id, PolicyView(0, canonical_allow(allow), mode), "start", 0, audit.GENESIS)

    def expected(self, session_id: str) -> PolicyView | None:
        """The policy the gateway last set on the session's proxy (read back after a gateway restart)."""
        view = self._expected.get(session_id)
        if view is None:
            stored = self.anchors.expected_policy(session_id)
            if stored is not None:
                view = self._expected[session_id] = PolicyView.from_record(stored)
        return view

    def expect(self, session_id: str, view: PolicyView, reason: str, seq: int, chain_hash: str) -> None:
        """``view`` is the policy the gateway set, anchored with the chain's head after it."""
        self.anchors.append(session_id, seq, chain_hash, reason, generation=view.generation, set=view.record())
        self._expected[session_id] = view

    def took(self, session_id: str, reply: Reply, reason: str) -> None:
        """A policy change the proxy answered: its policy expected from now on, with its head."""
        now = PolicyView.from_reply(reply)
        if reply.head is None:
            self._expected[session_id] = now  # a proxy from before generations: nothing to anchor
        else:
            self.expect(session_id, now, reason, reply.head.seq, reply.head.hash)

    def observe(self, session_id: str, reply: Reply, reason: str) -> None:
        """Anchor the proxy's chain head when it moved; say so loudly when it went back or changed."""
        if reply.head is None:
            log.debug("egress proxy of %s reports no chain head (an older image): nothing anchored", session_id)
            return
        seq, chain_hash = reply.head.seq, reply.head.hash
        last = self.anchors.last_head(session_id)
        if last is not None and (seq < last[0] or (seq == last[0] and chain_hash != last[1])):
            log.error(
                "the audit chain of %s is not the one anchored: head (%d, %s) after (%d, %s); truncated or rewritten",
                session_id,
                seq,
                chain_hash[:12],
                *last,
            )
        if last != (seq, chain_hash) or reason == "end":
            self.anchors.append(session_id, seq, chain_hash, reason, generation=reply.generation)

    def forget(self, session_id: str) -> None:
        """What this process holds of a session that ended (its anchors stay on disk)."""
        self._expected.pop(session_id, None)
        self.anchors.forget(session_id)

    def remove(self, session_id: str) -> None:
        """A session's anchors, from disk too (its state went)."""
        try:
            self.anchors.remove(session_id)
        except (ValueError, OSError) as exc:
            log.warning("cannot remove the audit anchors of %s: %s", session_id, exc)
