"""The sandbox's own preview door: its rules as pure functions (the Host it routes by, the ports it
refuses, whose listener it opens), then the door itself on this host's loopback with a real server."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from corral.sandbox.previewdoor import (
    MAX_HEAD_BYTES,
    RESERVED_PORTS,
    PreviewDoor,
    Refusal,
    diag_listeners,
    diag_request,
    host_header,
    listener_problem,
    listener_uids,
    listening,
    open_door,
    port_of,
    route,
)

HEX = "0123456789abcdef"
AGENT = 1000


def _row(local: str, remote: str, state: str, uid: int) -> str:
    """One socket's line of /proc/net/tcp*, as Linux prints it (the fields after the inode cut)."""
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 1"


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
ANY6 = "0" * 32 + ":0000"
# 127.0.0.1:3000 (0BB8) listening as 1000, 0.0.0.0:8080 (1F90) as 1000, 127.0.0.1:8765 (223D) as 999 (the
# controller), 10.0.0.5:4000 (0FA0) as 1000 (not loopback), 127.0.0.1:5000 (1388) connected, not listening.
TCP = "\n".join(
    [
        HEADER,
        _row("0100007F:0BB8", "00000000:0000", "0A", 1000),
        _row("00000000:1F90", "00000000:0000", "0A", 1000),
        _row("0100007F:223D", "00000000:0000", "0A", 999),
        _row("0500000A:0FA0", "00000000:0000", "0A", 1000),
        _row("0100007F:1388", "0100007F:D431", "01", 1000),
        "   5: garbage",
    ]
)
# [::1]:3000 as 998 (the browser), [::]:6000 (1770) as 1000, [::ffff:127.0.0.1]:7000 (1B58) as 1000.
TCP6 = "\n".join(
    [
        HEADER,
        _row("00000000000000000000000001000000:0BB8", ANY6, "0A", 998),
        _row("00000000000000000000000000000000:1770", ANY6, "0A", 1000),
        _row("0000000000000000FFFF00000100007F:1B58", ANY6, "0A", 1000),
    ]
)


def _head(host: str, extra: str = "") -> bytes:
    return f"GET /app?x=1 HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n{extra}\r\n".encode()


# -- the Host ------------------------------------------------------------------------------------------


def test_the_host_header_is_read_once_and_whole() -> None:
    assert host_header(_head(f"3000-{HEX}.localhost:8701")[:-4]) == f"3000-{HEX}.localhost:8701"
    assert host_header(b"GET / HTTP/1.1\r\nhOsT:  a.localhost \r\n") == "a.localhost"


@pytest.mark.parametrize(
    "head",
    [
        b"\x16\x03\x01\x02\x00",  # a TLS hello
        b"GET / HTTP/2.0\r\nHost: a\r\n",
        b"GET / HTTP/1.1\r\nAccept: */*\r\n",  # no Host
        b"GET / HTTP/1.1\r\nHost: 3000-ab.localhost\r\nHost: 9222-ab.localhost\r\n",  # two
        b"GET / HTTP/1.1\r\nHost: 3000-ab.localhost\xff\r\n",
    ],
)
def test_a_head_without_one_ascii_host_is_refused(head: bytes) -> None:
    refused = host_header(head)
    assert isinstance(refused, Refusal) and refused.status == 400


def test_the_port_comes_from_the_first_label_under_localhost() -> None:
    assert port_of(f"3000-{HEX}.localhost:8701") == 3000
    assert port_of(f"3000-{HEX}.LOCALHOST.") == 3000
    assert port_of(f"65535-{HEX}.localhost") == 65535


@pytest.mark.parametrize(
    "host",
    [
        f"3000-{HEX}.previews.example.test",  # the gateway's domain: never resolved to this loopback
        f"3000-{HEX}.evil.localhost",  # deeper
        "localhost:8701",
        "127.0.0.1:8701",
        "[::1]:8701",
        f"0-{HEX}.localhost",
        f"03000-{HEX}.localhost",
        f"70000-{HEX}.localhost",
        f"3000-{HEX.upper()}X.localhost",
        f"3000_{HEX}.localhost",
    ],
)
def test_other_names_are_no_preview(host: str) -> None:
    refused = port_of(host)
    assert isinstance(refused, Refusal) and refused.status == 404


@pytest.mark.parametrize("port", sorted(RESERVED_PORTS))
def test_the_reserved_ports_are_refused_by_number(port: int) -> None:
    refused = port_of(f"{port}-{HEX}.localhost")
    assert isinstance(refused, Refusal) and refused.status == 403 and "reserved" in refused.reason
    assert {8765, 9222, 8701} <= RESERVED_PORTS


# -- whose listener --------------------------------------------------------------------------------------


def test_listeners_are_read_from_the_tcp_tables_on_loopback_or_any_address() -> None:
    assert listener_uids([TCP, TCP6], 3000) == {1000, 998}
    assert listener_uids([TCP], 8080) == {1000}  # 0.0.0.0 answers on 127.0.0.1 too
    assert listener_uids([TCP6], 6000) == {1000}  # :: (dual stack)
    assert listener_uids([TCP6], 7000) == {1000}  # ::ffff:127.0.0.1
    assert listener_uids([TCP], 8765) == {999}
    assert listener_uids([TCP], 4000) == set()  # an interface's address, not loopback
    assert listener_uids([TCP], 5000) == set()  # a connection, not a listener
    assert listener_uids(["", "header only\n"], 3000) == set()


def test_only_a_port_the_agent_alone_listens_on_is_opened() -> None:
    assert listener_problem(8080, {AGENT}, AGENT) is None
    nothing = listener_problem(4000, set(), AGENT)
    assert nothing is not None and nothing.status == 502 and "nothing listens" in nothing.reason
    for uids in ({999}, {998}, {0}, {AGENT, 998}):
        refused = listener_problem(3000, uids, AGENT)
        assert refused is not None and refused.status == 403


def _tables(port: int) -> set[int]:
    return listener_uids([TCP, TCP6], port)


def test_route_puts_the_rules_together() -> None:
    assert route(_head(f"8080-{HEX}.localhost:8701"), AGENT, _tables) == 8080
    mixed = route(_head(f"3000-{HEX}.localhost:8701"), AGENT, _tables)  # the browser's on [::1]
    assert isinstance(mixed, Refusal) and mixed.status == 403
    reserved = route(_head(f"8765-{HEX}.localhost"), 999, _tables)  # even were the controller "the agent"
    assert isinstance(reserved, Refusal) and reserved.status == 403


# -- sock_diag ---------------------------------------------------------------------------------------------

_NL = struct.Struct("=IHHII")


def _diag_msg(family: int, src: bytes, port: int, uid: int, state: int = 10) -> bytes:
    sockid = struct.pack("!HH16s16sIII", port, 0, src.ljust(16, b"\0"), bytes(16), 0, 0, 0)
    body = struct.pack("=BBBB48sIIIII", family, state, 0, 0, sockid, 0, 0, 0, uid, 77)
    return _NL.pack(_NL.size + len(body), 20, 2, 1, 0) + body


def test_the_diag_request_asks_for_tcp_listeners_on_one_port() -> None:
    request = diag_request(socket.AF_INET6, 3000, seq=7)
    length, kind, flags, seq, _ = _NL.unpack_from(request)
    assert (length, kind, flags, seq) == (len(request), 20, 0x301, 7)
    family, protocol, _, _, states = struct.unpack_from("=BBBBI", request, _NL.size)
    assert (family, protocol, states) == (socket.AF_INET6, socket.IPPROTO_TCP, 1 << 10)
    assert struct.unpack_from("!H", request, _NL.size + 8) == (3000,)


def test_the_diag_answer_gives_the_loopback_listeners_uids() -> None:
    done = _NL.pack(_NL.size + 4, 3, 2, 1, 0) + bytes(4)
    answer = b"".join(
        [
            _diag_msg(socket.AF_INET, bytes([127, 0, 0, 1]), 3000, 1000),
            _diag_msg(socket.AF_INET, bytes(4), 3000, 1001),  # 0.0.0.0
            _diag_msg(socket.AF_INET, bytes([10, 0, 0, 5]), 3000, 1002),  # an interface's: not reached
            _diag_msg(socket.AF_INET6, bytes(15) + b"\x01", 3000, 998),  # ::1
            _diag_msg(socket.AF_INET6, bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]), 3000, 997),
            _diag_msg(socket.AF_INET, bytes([127, 0, 0, 1]), 3001, 996),  # another port
            _diag_msg(socket.AF_INET, bytes([127, 0, 0, 1]), 3000, 995, state=1),  # not listening
            done,
        ]
    )
    assert diag_listeners(answer, 3000) == ({1000, 1001, 998, 997}, True)
    assert diag_listeners(answer[: len(answer) - len(done)], 3000)[1] is False
    error = _NL.pack(_NL.size + 4, 2, 0, 1, 0) + struct.pack("=i", -22)
    with pytest.raises(OSError):
        diag_listeners(error, 3000)
    assert diag_listeners(b"\x05\x00", 3000) == (set(), False)  # cut short: nothing read, no crash


async def test_listening_asks_this_kernel(echo_server: int) -> None:
    assert listening(echo_server) == {os.getuid()}


def test_a_refusal_is_a_whole_http_answer() -> None:
    answer = Refusal(502, "nothing listens on port 3000 inside the sandbox").response()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head and b"nothing listens" in body


# -- the door on this host's loopback ---------------------------------------------------------------------


@pytest.fixture
async def echo_server() -> AsyncIterator[int]:
    """A server of this test's uid on 127.0.0.1 that answers its first request's head, then echoes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"seen " + head.split(b"\r\n", 1)[0]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        while data := await reader.read(1024):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield int(server.sockets[0].getsockname()[1])


async def _door(uid: int) -> PreviewDoor:
    door = PreviewDoor(uid, idle_s=5.0)
    await door.open(0)
    return door


async def _ask(door: PreviewDoor, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def test_the_door_splices_the_agents_server_both_ways(echo_server: int) -> None:
    door = await _door(os.getuid())
    try:
        reader, writer = await _ask(door, _head(f"{echo_server}-{HEX}.localhost:8701"))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.readexactly(len(b"seen GET /app?x=1 HTTP/1.1")) == b"seen GET /app?x=1 HTTP/1.1"
        writer.write(b"after the head: a WebSocket's frames, say")
        await writer.drain()
        assert await reader.readexactly(41) == b"after the head: a WebSocket's frames, say"
        writer.close()
    finally:
        await door.close()
    assert door.open_connections == 0


async def test_the_door_refuses_a_server_of_another_uid(echo_server: int) -> None:
    door = await _door(os.getuid() + 1)  # the server is this test's uid, not "the agent's"
    try:
        reader, writer = await _ask(door, _head(f"{echo_server}-{HEX}.localhost"))
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"not the agent's server" in answer
        writer.close()
    finally:
        await door.close()


async def test_the_door_answers_nothing_listens_and_a_head_too_long() -> None:
    door = await _door(os.getuid())
    try:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        free = int(probe.sockets[0].getsockname()[1])
        probe.close()
        await probe.wait_closed()
        reader, writer = await _ask(door, _head(f"{free}-{HEX}.localhost"))
        assert (await reader.read()).startswith(b"HTTP/1.1 502 Bad Gateway")
        writer.close()
        reader, writer = await _ask(door, b"GET / HTTP/1.1\r\nX-Long: " + b"a" * MAX_HEAD_BYTES)
        assert (await reader.read()).startswith(b"HTTP/1.1 431 ")
        writer.close()
    finally:
        await door.close()


async def test_the_door_is_off_at_port_zero_and_for_an_unknown_user() -> None:
    assert await open_door(0, "agent") is None
    assert await open_door(18701, "no-such-user-corral-test") is None
