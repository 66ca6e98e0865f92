"""The session's policy as it stands, and the vetting of names and addresses against it.

A target is decided by name first, before any lookup; an allowed name is resolved once, and every
address it resolves to must pass too (else a rebinding answer could smuggle one in). The first
address is the one the connection is pinned to. In report mode the allowlist's refusals are let
through and logged; the global deny, unparseable hosts and paths are refused in every mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from corral.proxy.audit import Outcome
from corral.proxy.hosts import parse_ip
from corral.proxy.policy import REPORTABLE_RULES, Decision, Policy

RESOLVE_TIMEOUT_S = 5.0

Lookup = Callable[[str, int], Awaitable[list[str]]]


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses of ``host``, from the system resolver without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(slots=True)
class Verdict:
    """What the proxy does about a decision: allow, deny, or report (allow, log the would-be deny)."""

    decision: Decision
    outcome: Outcome
    status: int = 403  # what a refusal answers: 403 by policy, 421 misdirected, 502 unresolvable

    @property
    def refused(self) -> bool:
        return self.outcome == "deny"


Resolution = tuple[str | None, Verdict]  # the vetted address (None: none may be dialled) and its verdict


class LivePolicy:
    """The allowlist, the mode and the generation (one more per change, kept in policy.json)."""

    def __init__(self, lookup: Lookup = system_lookup) -> None:
        self.policy = Policy([])
        self.mode = "enforce"
        self.generation = 0
        self.hermetic = False  # nothing is resolved or dialled: answers come from a recording
        self.lookup = lookup  # the one DNS seam (unit tests answer from a table)

    def verdict(self, decision: Decision, status: int = 403) -> Verdict:
        if decision.allowed:
            return Verdict(decision, "allow")
        if self.mode == "report" and status == 403 and decision.rule in REPORTABLE_RULES:
            return Verdict(decision, "report", status)  # the allowlist's refusal, let through and logged
        # The global deny (the proxy itself, private and metadata addresses, DoH), unparseable hosts
        # and paths: refused in every mode, before any lookup or dial.
        return Verdict(decision, "deny", status)

    async def vet(self, host: str, port: int) -> Resolution:
        """A target by name, then (unless refused) by every address it resolves to."""
        verdict = self.verdict(self.policy.connect(host, port))
        if verdict.refused:
            return None, verdict
        return merge(verdict, await self.resolve(host, port))

    async def resolve(self, host: str, port: int) -> Resolution:
        """One lookup; every address must pass."""
        if self.hermetic:
            # Nothing is dialled, so nothing is looked up: the name's own verdict stands.
            return None, Verdict(Decision(True, "hermetic replay: not resolved"), "allow")
        if parse_ip(host) is not None:
            return host, self.verdict(self.policy.resolved(host, host))
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                addresses = list(dict.fromkeys(await self.lookup(host, port)))
        except (OSError, TimeoutError) as exc:
            reason = f"cannot resolve {host}: {exc.strerror if isinstance(exc, OSError) else 'timed out'}"
            return None, Verdict(Decision(False, reason, "dns-error"), "deny", 502)
        chosen: str | None = None
        for address in addresses:
            verdict = self.verdict(self.policy.resolved(host, address))
            if not verdict.decision.allowed:
                return address if verdict.outcome == "report" else None, verdict
            chosen = chosen or address
        if chosen is None:
            return None, Verdict(Decision(False, f"{host} has no address", "dns-error"), "deny", 502)
        return chosen, Verdict(Decision(True, f"{host} resolves to {chosen}"), "allow")

    def restore(self, saved: Path) -> list[str]:
        """The allowlist persisted in ``saved`` (policy.json), with its mode and generation; [] if none."""
        if not saved.exists():
            return []
        stored = json.loads(saved.read_text())
        self.mode = str(stored.get("mode", self.mode))
        # Continued across restarts: the gateway compares it with the generation it last set.
        self.generation = int(stored.get("generation", 0))
        return list(stored.get("allow", []))

    @staticmethod
    def persist(saved: Path, allow: list[str], mode: str, generation: int) -> None:
        temporary = saved.with_suffix(".tmp")
        temporary.write_text(json.dumps({"allow": allow, "mode": mode, "generation": generation}))
        os.replace(temporary, saved)


def merge(verdict: Verdict, resolution: Resolution) -> Resolution:
    """The host's verdict combined with its address's: a refusal or a first denial wins."""
    ip, resolved = resolution
    if resolved.refused or (verdict.decision.allowed and not resolved.decision.allowed):
        return (None if resolved.refused else ip), resolved
    return ip, verdict
