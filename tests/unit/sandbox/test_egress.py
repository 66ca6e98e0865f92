"""The controller's reports of each action to the session's proxy, over a fake control channel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from corral.proxy import control
from corral.sandbox import egress
from corral.sandbox.egress import ActionReporter


@dataclass
class FakeProxy:
    """A control port that says hello, acknowledges every message and queues what it heard; ``drop``
    closes its connections, as a proxy that restarts does."""

    heard: asyncio.Queue[tuple[int, dict[str, object]]] = field(default_factory=asyncio.Queue)
    connections: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        number = len(self.connections)
        while line := await reader.readline():
            message = json.loads(line)
            await self.heard.put((number, message))
            writer.write(control.encode({"ok": True}))

    async def drop(self) -> None:
        for writer in self.connections:
            writer.close()
            await writer.wait_closed()

    async def next(self) -> tuple[int, dict[str, object]]:
        return await asyncio.wait_for(self.heard.get(), timeout=5)


@pytest.fixture
async def proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeProxy, ActionReporter]]:
    monkeypatch.setattr(egress, "RETRY_AFTER_S", 0.0)  # reconnect at once: no clock to wait on
    fake = FakeProxy()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    reporter = ActionReporter("127.0.0.1", server.sockets[0].getsockname()[1], "token")
    try:
        yield fake, reporter
    finally:
        await reporter.close()
        server.close()
        await fake.drop()


async def test_an_action_is_reported_after_a_hello(proxy: tuple[FakeProxy, ActionReporter]) -> None:
    fake, reporter = proxy
    await reporter.started("a1")
    assert await fake.next() == (1, {"op": "hello", "token": "token"})
    assert await fake.next() == (1, {"op": "action", "id": "a1", "phase": "start", "ack": True})


async def test_a_proxy_that_restarted_is_reported_to_on_a_new_connection(
    proxy: tuple[FakeProxy, ActionReporter],
) -> None:
    fake, reporter = proxy
    await reporter.started("a1")
    assert [await fake.next(), await fake.next()][-1][1]["id"] == "a1"
    await fake.drop()  # the proxy went away; its successor listens on the same port
    # The next actions go ahead whatever the old connection says, and a new one carries them.
    await reporter.started("a2")  # may find the old connection gone only as it waits for the answer
    await reporter.started("a3")
    heard = [await fake.next()]
    while heard[-1][1].get("id") != "a3":
        heard.append(await fake.next())
    assert heard[0] == (2, {"op": "hello", "token": "token"})
    assert heard[-1] == (2, {"op": "action", "id": "a3", "phase": "start", "ack": True})


async def test_the_first_action_after_a_proxy_restart_is_reported(proxy: tuple[FakeProxy, ActionReporter]) -> None:
    fake, reporter = proxy
    await reporter.started("a1")
    assert [await fake.next(), await fake.next()][-1][1]["id"] == "a1"
    await fake.drop()  # the proxy restarted; its successor listens on the same port
    await reporter.started("a2")
    await reporter.ended("a2")
    heard = [await fake.next() for _ in range(3)]
    assert heard == [
        (2, {"op": "hello", "token": "token"}),
        (2, {"op": "action", "id": "a2", "phase": "start", "ack": True}),
        (2, {"op": "action", "id": "a2", "phase": "end"}),  # no "ack": false: contracts.control leaves it off
    ]


async def test_an_action_whose_kept_connection_closes_under_it_goes_again_on_a_fresh_one(
    proxy: tuple[FakeProxy, ActionReporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, reporter = proxy
    await reporter.started("a1")
    assert [await fake.next(), await fake.next()][-1][1]["id"] == "a1"
    monkeypatch.setattr(egress, "RETRY_AFTER_S", 3600.0)  # no reconnect but the one retry
    monkeypatch.setattr(reporter, "_open", lambda: reporter._writer is not None)  # the close not yet seen
    await fake.drop()
    await reporter.started("a2")
    heard = [await fake.next() for _ in range(2)]
    assert heard[-1] == (2, {"op": "action", "id": "a2", "phase": "start", "ack": True})
