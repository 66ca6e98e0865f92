"""The controller's side of the egress audit: it tells the session's proxy when each action starts
and ends, so every request the proxy logs names the action that caused it.

One connection, kept open. ``started`` waits for the proxy's acknowledgement (well under a
millisecond on the session network) so the proxy knows the action before its input can cause any
request; ``ended`` does not wait. When the proxy is down the action goes ahead at once (the
sandbox has no egress then anyway) and the reporter reconnects at most once a second; a
connection the proxy closed (it restarted) is replaced at the next action, at once: an action that
finds its kept connection closed is sent again on a fresh one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from corral.contracts.control import ActionEvent, DownloadEvent, Hello, LeaseEvent, encode
from corral.streams import closed

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 0.25
RETRY_AFTER_S = 1.0


class ActionReporter:
    def __init__(self, host: str, port: int, token: str) -> None:
        self._host, self._port, self._token = host, port, token
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._next_try = 0.0

    def _open(self) -> bool:
        """Whether the kept connection is still up: not closed here, and not ended by the proxy (a
        peer's close leaves the transport half-open, so only the reader knows)."""
        return (
            self._writer is not None
            and not self._writer.is_closing()
            and self._reader is not None
            and not self._reader.at_eof()
        )

    async def _connect(self) -> bool:
        if self._open():
            return True
        self._drop()  # a proxy that restarted closed the old connection: open a new one
        if time.monotonic() < self._next_try:
            return False
        self._next_try = time.monotonic() + RETRY_AFTER_S
        try:
            async with asyncio.timeout(ACK_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(self._host, self._port)
                writer.write(encode(Hello(self._token)))
                hello = json.loads(await reader.readline() or b"{}")
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("egress proxy control channel not reachable: %s", exc or type(exc).__name__)
            return False
        if not hello.get("ok"):
            log.error("egress proxy refused the controller: %s", hello.get("error"))
            writer.close()
            return False
        self._reader, self._writer = reader, writer
        return True

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def _send(self, message: ActionEvent | LeaseEvent | DownloadEvent) -> None:
        async with self._lock:
            kept = self._writer if self._open() else None
            if not await self._connect():
                return
            if await self._deliver(message) or kept is None:
                return
            # The kept connection was closed under us (the proxy restarted since the last action):
            # once more on a fresh one at once, so the first action after a restart is reported.
            self._next_try = 0.0
            if await self._connect():
                await self._deliver(message)

    async def _deliver(self, message: ActionEvent | LeaseEvent | DownloadEvent) -> bool:
        """One message out; an action's start waits for the proxy's acknowledgement."""
        ack = isinstance(message, ActionEvent) and message.ack
        assert self._writer is not None and self._reader is not None
        try:
            self._writer.write(encode(message))
            if ack:
                async with asyncio.timeout(ACK_TIMEOUT_S):
                    await self._writer.drain()
                    if not await self._reader.readline():
                        raise ConnectionResetError("the proxy closed the control channel")
        except (OSError, TimeoutError) as exc:
            log.warning("egress proxy control channel lost: %s", exc or type(exc).__name__)
            self._drop()
            return False
        return True

    async def started(self, action_id: str, actor: str | None = None) -> None:
        """``actor``: who acted when not the agent (``human:<link id>``, ``cdp:<conn id>``)."""
        await self._send(ActionEvent(action_id, "start", ack=True, actor=actor))

    async def ended(self, action_id: str, actor: str | None = None) -> None:
        await self._send(ActionEvent(action_id, "end", actor=actor))

    async def lease_changed(self, change: str, holder: str, previous: str) -> None:
        """A change of the control lease, for the audit log (corral.contracts.control.LeaseEvent)."""
        await self._send(LeaseEvent(change, holder, previous))

    async def download_changed(self, event: DownloadEvent) -> None:
        """A download begun or ended, for the audit log (corral.contracts.control.DownloadEvent)."""
        await self._send(event)

    async def close(self) -> None:
        async with self._lock:
            if self._writer is not None:
                await closed(self._writer)  # bounded, as every close of a stream a peer may stop reading
            self._reader = self._writer = None
