"""A stand-in egress proxy's control channel for the gateway's tests: it speaks the real protocol
(hello, then one message), keeps one state per session (told apart by the gateway's derived token) and
answers ``status``, ``policy`` and ``secrets`` as the proxy's addon does: generation, chain head, and
the secrets it holds (``loaded`` false after a "restart", which keeps names and drops values; each
loaded value's digest keyed with the gateway's token; an entry without a value keeps the one held)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from corral.contracts.placeholders import value_digest
from corral.proxy import control
from corral.proxy.policy import parse_rule


@dataclass
class ProxyState:
    key: str = ""  # the gateway's control token: the key of the values' digests
    allow: list[str] = field(default_factory=list)
    mode: str = "enforce"
    generation: int = 0
    seq: int = 0
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the op's entry, value included
    secrets_generation: int = 0
    revoked: set[str] = field(default_factory=set)  # placeholders of revoked secrets: never taken back
    messages: list[dict[str, Any]] = field(default_factory=list)  # every policy, secrets and lifetime op, in order

    def secrets_ops(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["op"] == "secrets"]

    @property
    def loaded(self) -> bool:
        return all("value" in entry for entry in self.secrets.values())

    def restart(self) -> None:
        """As a restarted proxy: the names kept (its state file), the values gone."""
        for entry in self.secrets.values():
            entry.pop("value", None)

    def digests(self) -> dict[str, str]:
        return {n: value_digest(self.key, e["value"].encode()) for n, e in sorted(self.secrets.items()) if "value" in e}

    def answer(self) -> dict[str, Any]:
        return {
            "ok": True,
            "allow": self.allow,
            "mode": self.mode,
            "generation": self.generation,
            "head": {"seq": self.seq, "hash": f"h{self.seq}"},
            "secrets": {
                "generation": self.secrets_generation,
                "names": sorted(self.secrets),
                "loaded": self.loaded,
                "digests": self.digests(),
            },
        }


class FakeControlProxy:
    """Every session's proxy at once, on one loopback port; ``refuse`` makes it refuse the next ops,
    ``lose`` apply them and lose the answer, ``drop`` drop them unanswered, ``garble`` answer them
    with a reply of the wrong shape."""

    def __init__(self) -> None:
        self.states: dict[str, ProxyState] = {}  # by the gateway's token
        self.refuse: set[str] = set()  # ops to refuse
        self.lose: set[str] = set()  # ops applied whose answer is lost (the connection closes first)
        self.drop: set[str] = set()  # ops dropped unapplied, unanswered
        self.garble: set[str] = set()  # ops applied and answered with a reply of the wrong shape
        self.held: dict[str, asyncio.Event] = {}  # op -> set when ops of that kind may be applied
        self.holding = asyncio.Event()  # an op is waiting on ``held``
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
        return self.states.setdefault(token, ProxyState(key=token))

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
            held = state.secrets
            state.secrets = {entry["name"]: dict(entry) for entry in message["secrets"]}
            for name, entry in state.secrets.items():  # an entry without a value keeps the one held
                if "value" not in entry and "value" in held.get(name, {}):
                    entry["value"] = held[name]["value"]
            state.secrets_generation += 1
            state.seq += 1
        elif op == "lifetime":
            state.messages.append(message)
        return state.answer()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        writer.write(control.encode({"ok": True, "role": "gateway"}))
        message = json.loads(await reader.readline())
        gate = self.held.get(message["op"])
        if gate is not None:
            self.holding.set()
            await gate.wait()
        if message["op"] not in self.drop:
            answer = self._apply(self.state(hello["token"]), message)
            if message["op"] in self.garble:
                answer = {**answer, "generation": "not a number"}
            if message["op"] not in self.lose:
                writer.write(control.encode(answer))
                await writer.drain()
        writer.close()
