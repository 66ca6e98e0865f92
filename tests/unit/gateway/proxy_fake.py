"""A stand-in egress proxy's control channel for the gateway's tests: it speaks the real protocol
(hello, then one message), keeps one state per session (told apart by the gateway's derived token) and
answers ``status``, ``policy`` and ``secrets`` as the proxy's addon does: generation, chain head, and
the secrets it holds (``loaded`` false after a "restart", which keeps names and drops values)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from corral.proxy import control
from corral.proxy.policy import parse_rule


@dataclass
class ProxyState:
    allow: list[str] = field(default_factory=list)
    mode: str = "enforce"
    generation: int = 0
    seq: int = 0
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the op's entry, value included
    secrets_generation: int = 0
    loaded: bool = True
    revoked: set[str] = field(default_factory=set)  # placeholders of revoked secrets: never taken back
    messages: list[dict[str, Any]] = field(default_factory=list)  # every policy and secrets op, in order

    def secrets_ops(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["op"] == "secrets"]

    def restart(self) -> None:
        """As a restarted proxy: the names kept (its state file), the values gone."""
        self.loaded = False
        for entry in self.secrets.values():
            entry.pop("value", None)

    def answer(self) -> dict[str, Any]:
        return {
            "ok": True,
            "allow": self.allow,
            "mode": self.mode,
            "generation": self.generation,
            "head": {"seq": self.seq, "hash": f"h{self.seq}"},
            "secrets": {"generation": self.secrets_generation, "names": sorted(self.secrets), "loaded": self.loaded},
        }


class FakeControlProxy:
    """Every session's proxy at once, on one loopback port; ``refuse`` makes it refuse the next ops."""

    def __init__(self) -> None:
        self.states: dict[str, ProxyState] = {}  # by the gateway's token
        self.refuse: set[str] = set()  # ops to refuse
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def state(self, token: str) -> ProxyState:
        return self.states.setdefault(token, ProxyState())

    def _apply(self, state: ProxyState, message: dict[str, Any]) -> dict[str, Any]:
        op = message["op"]
        if op in self.refuse:
            return {"ok": False, "code": "invalid_field", "error": f"the proxy refused {op}", "field": op}
        if op == "policy":
            state.messages.append(message)
            state.allow, state.mode = [str(parse_rule(a)) for a in message["allow"]], message["mode"]
            state.generation += 1
            state.seq += 1
        elif op == "secrets":
            back = [e["name"] for e in message["secrets"] if e["placeholder"] in state.revoked]
            if back:  # as the proxy's SecretBook.plan: a revoked placeholder never comes back
                return {"ok": False, "code": "invalid_field", "error": f"{back[0]}'s placeholder was revoked"}
            state.messages.append(message)
            names = {entry["name"] for entry in message["secrets"]}
            state.revoked |= {e["placeholder"] for name, e in state.secrets.items() if name not in names}
            state.secrets = {entry["name"]: dict(entry) for entry in message["secrets"]}
            state.secrets_generation += 1
            state.loaded = True
            state.seq += 1
        return state.answer()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        writer.write(control.encode({"ok": True, "role": "gateway"}))
        message = json.loads(await reader.readline())
        writer.write(control.encode(self._apply(self.state(hello["token"]), message)))
        await writer.drain()
        writer.close()
