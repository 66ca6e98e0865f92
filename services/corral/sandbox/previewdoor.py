"""The sandbox's own door to its previews: ``http://{port}-{session hex}.localhost:8701/`` opened by the
sandbox's browser (or any program in it) reaches the agent's server on ``127.0.0.1:{port}``, without
the sandbox reaching the gateway or the host (docs/previews.md, "From the sandbox's own browser").

Chromium resolves every ``*.localhost`` name to loopback itself and never sends it through the proxy,
so the name lands here, on the sandbox's own ``127.0.0.1:8701`` (and ``[::1]:8701``). The controller
listens there (:class:`PreviewDoor`), reads the first request's head (bounded), routes the connection
by its ``Host`` and then splices bytes both ways: HTTP, keep-alive and WebSocket alike.

No secret is asked: everything in the sandbox already reaches its own loopback servers. What the
door must not do is lend the controller's uid to anyone: it connects as ``corral``, which the
firewall does not fence, so it refuses by its own rules (pure, below) what the agent's and the
browser's uids cannot reach themselves: the reserved ports (the controller's, DevTools', its own),
and any port whose listener is not the agent's uid (:func:`listener_problem`, read from
``/proc/net/tcp*``): it opens the agent's servers to the agent's browser, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pwd
import re
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from corral.contracts.previews import RESERVED_PORTS, SANDBOX_PREVIEW_PORT, parse_host, port_problem
from corral.streams import closed

log = logging.getLogger("corral.previewdoor")

DOMAIN: Final = "localhost"  # the in-sandbox name, whatever the gateway's CORRAL_PREVIEW_DOMAIN
MAX_HEAD_BYTES: Final = 16 << 10  # a request head longer than this is refused (431)
HEAD_TIMEOUT_S: Final = 10.0  # the first request's head must come within this
CONNECT_TIMEOUT_S: Final = 5.0
IDLE_TIMEOUT_S: Final = 600.0  # no byte either way for this long closes the connection
MAX_CONNECTIONS: Final = 256  # open at once; past it, 503
CHUNK: Final = 64 << 10
TCP_TABLES: Final = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN: Final = "0A"  # a socket's state in /proc/net/tcp*
# sock_diag (linux/inet_diag.h): the listeners on one port asked of the kernel, which walks its
# listening sockets only. /proc/net/tcp walks every TCP socket of the host, whatever the namespace:
# on a busy host about 15 ms a read, 100 ms under a sandbox's CPU quota, on every connection.
NETLINK_SOCK_DIAG: Final = 4
SOCK_DIAG_BY_FAMILY: Final = 20
NLM_F_REQUEST_DUMP: Final = 0x1 | 0x300
NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
TCP_LISTEN: Final = 10
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then the socket id
_SOCKID = struct.Struct("!HH16s16sIII")  # sport, dport (network order), src, dst, interface, cookie
_DIAG_MSG = struct.Struct("=BBBB48sIIIII")  # family, state, timer, retrans, id, expires, rq, wq, uid, inode

_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} \S{1,8192} HTTP/1\.[01]")
_PHRASES: Final = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the door answers a connection itself (an HTTP status and a sentence) and closes it."""

    status: int
    reason: str

    def response(self) -> bytes:
        body = f"corral preview: {self.reason}\n".encode()
        head = (
            f"HTTP/1.1 {self.status} {_PHRASES.get(self.status, 'Error')}\r\n"
            "content-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\n"
            "cache-control: no-store\r\n"
            "connection: close\r\n\r\n"
        )
        return head.encode() + body


# -- the rules (pure) --------------------------------------------------------------------------------


def host_header(head: bytes) -> str | Refusal:
    """The one ``Host`` of a request head (up to its blank line), or why there is none to route by:
    not HTTP/1.x, no Host, or two (a name one reader takes and another skips routes nowhere)."""
    lines = head.split(b"\r\n")
    if not _REQUEST_LINE.fullmatch(lines[0]):
        return Refusal(400, "not an HTTP/1.1 request")
    hosts = [line.split(b":", 1)[1].strip() for line in lines[1:] if line[:5].lower() == b"host:"]
    if len(hosts) != 1:
        return Refusal(400, "a request needs exactly one Host header")
    try:
        return hosts[0].decode("ascii")
    except UnicodeDecodeError:
        return Refusal(400, "the Host header is not ASCII")


def port_of(host: str) -> int | Refusal:
    """The port a ``{port}-{hex}.localhost[:port]`` name previews (corral.contracts.previews' reading),
    or the refusal: another name (404), a reserved port (403: the controller's, DevTools', this door's)."""
    found = parse_host(host, DOMAIN)
    if found is None:
        return Refusal(
            404, f"{host.strip()[:100]!r} names no preview: open http://{{port}}-{{session}}.localhost:8701/"
        )
    problem = port_problem(found.port)
    if problem is not None:
        return Refusal(403, problem)
    return found.port


def listener_uids(tables: Iterable[str], port: int) -> set[int]:
    """The uids of the sockets listening on ``port`` on a loopback or wildcard address, from the text
    of ``/proc/net/tcp`` and ``/proc/net/tcp6`` (one line a socket; a line that does not parse is skipped)."""
    uids: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if not hex_port or int(hex_port, 16) != port or not _loopback_or_any(address):
                continue
            with contextlib.suppress(ValueError):
                uids.add(int(fields[7]))
    return uids


def _loopback_or_any(address: str) -> bool:
    """``/proc/net/tcp*``'s hex address (host byte order, 32-bit words): 0.0.0.0, 127/8, ::, ::1 or
    ::ffff:127/104. Anything else (an interface's own address) is not reached through 127.0.0.1."""
    if len(address) == 8:
        return address == "00000000" or address.endswith("7F")  # little-endian: 127 is the last byte
    if len(address) == 32:
        words = [address[i : i + 8] for i in range(0, 32, 8)]
        if words[:3] == ["00000000"] * 3 and words[3] in ("00000000", "01000000"):
            return True
        return words[:2] == ["00000000"] * 2 and words[2] == "FFFF0000" and words[3].endswith("7F")
    return False


def diag_request(family: int, port: int, seq: int = 1) -> bytes:
    """A sock_diag dump of the TCP sockets of ``family`` listening on ``port`` (the kernel filters
    listeners by their source port)."""
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + _SOCKID.pack(
        port, 0, bytes(16), bytes(16), 0, 0, 0
    )
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, seq, 0) + body


def diag_listeners(data: bytes, port: int) -> tuple[set[int], bool]:
    """The uids of the loopback or wildcard listeners on ``port`` in a sock_diag answer's bytes, and
    whether the dump ended (NLMSG_DONE) in them. Raises OSError for the kernel's error message."""
    uids: set[int] = set()
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size or offset + length > len(data):
            break
        if kind == NLMSG_DONE:
            return uids, True
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", data, offset + _NLMSG.size)
            raise OSError(-errno, "sock_diag refused the dump")
        if kind == SOCK_DIAG_BY_FAMILY and length >= _NLMSG.size + _DIAG_MSG.size:
            family, state, _, _, sockid, _, _, _, uid, _ = _DIAG_MSG.unpack_from(data, offset + _NLMSG.size)
            sport, _, src, _, _, _, _ = _SOCKID.unpack(sockid)
            if state == TCP_LISTEN and sport == port and _diag_loopback_or_any(family, src):
                uids.add(uid)
        offset += (length + 3) & ~3
    return uids, False


def _diag_loopback_or_any(family: int, src: bytes) -> bool:
    if family == socket.AF_INET:
        return src[:4] == bytes(4) or src[0] == 127
    return src in (bytes(16), bytes(15) + b"\x01") or (src[:12] == bytes(10) + b"\xff\xff" and src[12] == 127)


def _diag(port: int) -> set[int]:
    """The listeners on ``port`` asked of the kernel (both families); OSError when sock_diag is not there."""
    uids: set[int] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            sock.send(diag_request(family, port, seq))
            for _ in range(64):  # a few messages at most: listeners on one port
                found, done = diag_listeners(sock.recv(1 << 16), port)
                uids |= found
                if done:
                    break
    return uids


def listening(port: int) -> set[int]:
    """The uids listening on ``port`` on loopback or any address: from sock_diag, else (a kernel or
    runtime without it) from ``/proc/net/tcp*``."""
    try:
        return _diag(port)
    except OSError:
        return listener_uids(_tables(), port)


def listener_problem(port: int, uids: set[int], agent_uid: int) -> Refusal | None:
    """None when only the agent's uid listens on ``port``; else the refusal (nothing listens: 502;
    another uid listens, the controller's, the browser's, root's: 403, never lent the door's uid)."""
    if not uids:
        return Refusal(502, f"nothing listens on port {port} inside the sandbox")
    if uids != {agent_uid}:
        return Refusal(403, f"port {port} is not the agent's server")
    return None


# -- the door --------------------------------------------------------------------------------------


def _tables() -> list[str]:
    found = []
    for path in TCP_TABLES:
        with contextlib.suppress(OSError):
            found.append(path.read_text(encoding="ascii", errors="replace"))
    return found


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Splice:
    """Bytes both ways between two streams until both ended or nothing moved for ``idle_s``."""

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._moved = time.monotonic()

    async def run(self, a: Stream, b: Stream) -> None:
        pumps = [asyncio.create_task(self._pump(a[0], b[1])), asyncio.create_task(self._pump(b[0], a[1]))]
        try:
            await asyncio.gather(*pumps)
        finally:
            for pump in pumps:
                pump.cancel()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    chunk = await source.read(CHUNK)
            except TimeoutError:
                if time.monotonic() - self._moved < self._idle_s:
                    continue  # the other way is busy: a quiet side of a live connection
                raise
            if not chunk:
                if sink.can_write_eof():
                    with contextlib.suppress(OSError):
                        sink.write_eof()
                return
            self._moved = time.monotonic()
            sink.write(chunk)
            await sink.drain()


class PreviewDoor:
    """The controller's listener on the sandbox's ``127.0.0.1:8701`` and ``[::1]:8701``."""

    def __init__(
        self, agent_uid: int, *, idle_s: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self._agent_uid = agent_uid
        self._idle_s = idle_s
        self._max = max_connections
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def open(self, port: int = SANDBOX_PREVIEW_PORT) -> None:
        """Listen on both loopbacks (Chromium may try ``::1`` first); IPv6 missing is no failure."""
        for host in ("127.0.0.1", "::1"):
            try:
                server = await asyncio.start_server(
                    self._accepted, host, port, limit=MAX_HEAD_BYTES, reuse_address=True
                )
            except OSError as exc:
                if host == "127.0.0.1":
                    raise
                log.info("preview door: no [::1]:%d (%s)", port, exc)
                continue
            self._servers.append(server)
        log.info("preview door on 127.0.0.1:%d for the agent's servers", port)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    @property
    def port(self) -> int:
        """The port it listens on (the one asked, or the system's pick for 0)."""
        return int(self._servers[0].sockets[0].getsockname()[1])

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self._max:
                await _answer(writer, Refusal(503, "too many preview connections open"))
                return
            await self._serve(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a peer gone or silent: the connection is simply closed
        except asyncio.CancelledError:
            pass  # the door closing (its own close cancels): asyncio's server callback wants no error
        finally:
            self._connections.discard(task)
            await closed(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _answer(writer, Refusal(431, f"a request head over {MAX_HEAD_BYTES} bytes"))
            return
        except TimeoutError:
            await _answer(writer, Refusal(408, "no request head in time"))
            return
        decided = route(head, self._agent_uid, listening)
        if isinstance(decided, Refusal):
            log.info("preview door refused: %s", decided.reason)
            await _answer(writer, decided)
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                upstream = await asyncio.open_connection("127.0.0.1", decided)
        except OSError:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    upstream = await asyncio.open_connection("::1", decided)
            except OSError as exc:
                await _answer(writer, Refusal(502, f"port {decided} refused the connection ({exc.strerror})"))
                return
        up_reader, up_writer = upstream
        try:
            up_writer.write(head)
            await _Splice(self._idle_s).run((reader, writer), (up_reader, up_writer))
        finally:
            await closed(up_writer)


def route(head: bytes, agent_uid: int, listeners: Callable[[int], set[int]]) -> int | Refusal:
    """Where a connection whose first request has ``head`` goes (a port on loopback), or its refusal;
    ``listeners(port)``: the uids listening there (:func:`listening`)."""
    host = host_header(head[:-4] if head.endswith(b"\r\n\r\n") else head)
    if isinstance(host, Refusal):
        return host
    port = port_of(host)
    if isinstance(port, Refusal):
        return port
    problem = listener_problem(port, listeners(port), agent_uid)
    return problem if problem is not None else port


async def _answer(writer: asyncio.StreamWriter, refusal: Refusal) -> None:
    writer.write(refusal.response())
    with contextlib.suppress(OSError):
        await writer.drain()


async def open_door(port: int, agent_user: str) -> PreviewDoor | None:
    """The door on ``port`` for ``agent_user``'s servers; None when off (``port`` 0) or when it cannot
    open (no such user outside the image; the port taken, say by the agent while the controller
    restarted): the controller serves on without it, never a crash loop the agent could cause."""
    if not port:
        return None
    try:
        door = PreviewDoor(pwd.getpwnam(agent_user).pw_uid)
        await door.open(port)
    except (KeyError, OSError) as exc:
        log.warning("preview door: not opened on port %d (%s)", port, exc)
        return None
    return door


__all__ = [
    "RESERVED_PORTS",
    "SANDBOX_PREVIEW_PORT",
    "PreviewDoor",
    "Refusal",
    "diag_listeners",
    "diag_request",
    "host_header",
    "listener_problem",
    "listener_uids",
    "listening",
    "open_door",
    "port_of",
    "route",
]
