"""The two HTTP/1.1 ends of a preview connection, each an h11 state machine over its bytes: the
client's socket (the listener is the server) and the tunnel to the agent's server (the listener is
the client). Both count what passes and note when it did (the idle timeout), on the connection's
:class:`~corral.gateway.previews.book.PreviewConnection`."""

from __future__ import annotations

import asyncio

import h11

from corral.gateway.previews.book import PreviewConnection as Tally
from corral.gateway.previews.tunnel import Tunnel

READ_BYTES = 256 << 10
MAX_RESPONSE_HEAD = 64 << 10  # the agent's server's status line and headers


class ClientSide:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_head: int, tally: Tally) -> None:
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self._reader, self._writer = reader, writer
        self.tally = tally

    async def read_raw(self) -> bytes:
        data = await self._reader.read(READ_BYTES)
        self.tally.bytes_in += len(data)
        self.tally.moved()
        return data

    async def write_raw(self, data: bytes) -> None:
        self._writer.write(data)
        self.tally.bytes_out += len(data)
        await self._writer.drain()
        self.tally.moved()

    async def event(self) -> h11.Event | type[h11.PAUSED]:
        """The client's next event (h11.RemoteProtocolError for one that is no HTTP/1.1, or too big)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            self.h11.receive_data(await self.read_raw())

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.write_raw(data)

    @property
    def answering(self) -> bool:
        """Whether an answer to the client has begun (an error can no longer be sent whole)."""
        return self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE)


class UpstreamSide:
    """The agent's server, through one tunnel; kept across a client's requests while both sides keep
    the connection alive."""

    def __init__(self, tunnel: Tunnel, tally: Tally) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD)
        self.tunnel = tunnel
        self.tally = tally

    async def event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.tunnel.read()
            self.tally.moved()
            self.h11.receive_data(data)

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.tunnel.write(data)
            self.tally.moved()

    def reusable(self) -> bool:
        """Ready for the client's next request (both ends done, neither closing): h11's next cycle."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False
