"""The gateway's end of a preview's tunnel: the controller's ``WS /v1/tunnel/{port}`` (signed and
proven like every controller call: corral.gateway.controller) as a byte stream. Opened by the
gateway towards the sandbox only: nothing in the sandbox can open one, or reach the gateway by it."""

from __future__ import annotations

import contextlib

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.protocol import State

from corral.contracts.previews import CLOSE_NOTHING_LISTENS, TUNNEL_CHUNK_BYTES, TUNNEL_PATH
from corral.errors import NothingListening, PreviewUnreachable, UnprovenController
from corral.gateway import controller
from corral.runtime import SandboxAddress


class Tunnel:
    """Bytes to and from one connection to the previewed port, in chunks of at most TUNNEL_CHUNK_BYTES (256 KiB)."""

    def __init__(self, ws: ClientConnection, port: int) -> None:
        self._ws = ws
        self.port = port

    @classmethod
    async def open(cls, sandbox: SandboxAddress, port: int) -> Tunnel:
        """PreviewUnreachable when the controller does not open it (NothingListening shows on the
        first :meth:`read`: the controller accepts, then closes with 4502)."""
        path = TUNNEL_PATH.format(port=port)
        try:
            ws = await controller.connect_ws(sandbox.ws_url, sandbox.secret, path, max_size=TUNNEL_CHUNK_BYTES)
        except (InvalidHandshake, OSError, TimeoutError, UnprovenController) as exc:
            raise PreviewUnreachable(f"the sandbox's controller did not open a tunnel to port {port}: {exc}") from None
        return cls(ws, port)

    @property
    def is_open(self) -> bool:
        """Whether the controller still holds it (a server that closed an idle kept-alive connection
        closed its tunnel too: a new request needs a new one)."""
        return self._ws.state is State.OPEN

    async def read(self) -> bytes:
        """The next bytes from the server; b"" once it closed its end. NothingListening when nothing
        listens on the port; PreviewUnreachable for any other failure."""
        try:
            frame = await self._ws.recv()
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1000:
                return b""
            raise self._failure(exc) from None
        return frame.encode() if isinstance(frame, str) else frame

    async def write(self, data: bytes) -> None:
        try:
            for start in range(0, len(data), TUNNEL_CHUNK_BYTES):
                await self._ws.send(data[start : start + TUNNEL_CHUNK_BYTES])
        except ConnectionClosed as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: ConnectionClosed) -> NothingListening | PreviewUnreachable:
        """What a tunnel closed by the controller says: nothing listening (4502, with its reason),
        or another failure (its code and reason)."""
        code = exc.rcvd.code if exc.rcvd is not None else None
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        if code == CLOSE_NOTHING_LISTENS:
            return NothingListening(f"nothing listens on port {self.port} in the sandbox: {reason}")
        return PreviewUnreachable(f"the tunnel to port {self.port} closed ({code}{': ' + reason if reason else ''})")

    async def close(self) -> None:
        with contextlib.suppress(ConnectionClosed, OSError):
            await self._ws.close()
