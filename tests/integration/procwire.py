"""A raw WebSocket to a sandbox's controller for the command tests: requests sent without waiting,
replies matched by id, events (frames without ``ok``) kept per request in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from corral.client import _dial
from corral.runtime import SandboxAddress


class Wire:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: dict[int, list[dict[str, Any]]] = {}
        self.frames: list[dict[str, Any]] = []  # every frame, in arrival order

    async def _read(self) -> None:
        async for text in self._ws:
            frame = json.loads(text)
            self.frames.append(frame)
            if "ok" in frame:
                future = self._replies.get(frame["id"])
                if future is not None and not future.done():
                    future.set_result(frame)
            else:
                self.events.setdefault(frame["id"], []).append(frame)

    async def send(self, action: dict[str, Any], **envelope: Any) -> int:
        request_id = next(self._ids)
        self._replies[request_id] = asyncio.get_running_loop().create_future()
        await self._ws.send(json.dumps({"id": request_id, "action": action, **envelope}))
        return request_id

    async def reply(self, request_id: int, timeout_s: float = 30) -> dict[str, Any]:
        return await asyncio.wait_for(self._replies[request_id], timeout_s)

    async def call(self, action: dict[str, Any], timeout_s: float = 30, **envelope: Any) -> dict[str, Any]:
        """The whole reply (``ok`` true or false)."""
        return await self.reply(await self.send(action, **envelope), timeout_s)

    async def result(self, action: dict[str, Any], timeout_s: float = 30) -> dict[str, Any]:
        reply = await self.call(action, timeout_s)
        assert reply["ok"], reply
        result: dict[str, Any] = reply["result"]
        return result


@contextlib.asynccontextmanager
async def wire(sandbox: SandboxAddress) -> AsyncIterator[Wire]:
    options, _signed = _dial(sandbox.secret)
    async with connect(sandbox.ws_url, **options) as ws:
        w = Wire(ws)
        reader = asyncio.create_task(w._read())
        try:
            yield w
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
