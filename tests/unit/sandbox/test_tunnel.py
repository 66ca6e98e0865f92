"""The controller's side of a preview's tunnel (corral.sandbox.tunnel): bytes both ways to a server
on the loopback, 4502 with the reason when nothing listens there, 4403 for a reserved port and for
a port whose listener is not the agent's uid (here the test's own uid plays the agent)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contracts.previews import CLOSE_BAD_PORT, CLOSE_NOTHING_LISTENS, CLOSE_RESERVED_PORT
from corral.sandbox import tunnel


async def route(websocket: WebSocket) -> None:
    await tunnel.serve(websocket, websocket.path_params["port"], os.getuid())


async def root_listens(websocket: WebSocket) -> None:
    """The same tunnel, where the kernel says root listens on the port (the seam: listeners)."""
    await tunnel.serve(websocket, websocket.path_params["port"], os.getuid() + 1, listeners=lambda port: {0})


APP = Starlette(routes=[WebSocketRoute("/v1/tunnel/{port}", route), WebSocketRoute("/v1/foreign/{port}", root_listens)])


@pytest.fixture()
def upper_server() -> Iterator[int]:
    """A one-connection server on 127.0.0.1 that answers each read in upper case."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    listener.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bytes_go_both_ways(upper_server: int) -> None:
    with TestClient(APP) as client, client.websocket_connect(f"/v1/tunnel/{upper_server}") as ws:
        ws.send_bytes(b"hello")
        assert ws.receive_bytes() == b"HELLO"
        big = b"x" * 200_000
        ws.send_bytes(big)
        got = b""
        while len(got) < len(big):
            got += ws.receive_bytes()
        assert got == big.upper()


def test_nothing_listening_closes_with_4502_and_the_reason() -> None:
    port = free_port()
    with (
        TestClient(APP) as client,
        client.websocket_connect(f"/v1/tunnel/{port}") as ws,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        ws.receive_bytes()
    assert closed.value.code == CLOSE_NOTHING_LISTENS
    assert closed.value.reason == f"connection refused on port {port}"


@pytest.mark.parametrize(("port", "code"), [("8765", CLOSE_RESERVED_PORT), ("9222", CLOSE_RESERVED_PORT),
                                            ("8701", CLOSE_RESERVED_PORT), ("0", CLOSE_BAD_PORT),
                                            ("70000", CLOSE_BAD_PORT), ("x1", CLOSE_BAD_PORT)])  # fmt: skip
def test_a_port_no_preview_may_reach_is_never_connected_to(port: str, code: int) -> None:
    with (
        TestClient(APP) as client,
        client.websocket_connect(f"/v1/tunnel/{port}") as ws,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        ws.receive_bytes()
    assert closed.value.code == code


def test_a_server_not_of_the_agents_uid_is_never_connected_to(upper_server: int) -> None:
    """The controller connects as itself, which the firewall does not fence: a port root, the browser
    or the controller listens on is refused before any connection, never lent the controller's uid."""
    with (
        TestClient(APP) as client,
        client.websocket_connect(f"/v1/foreign/{upper_server}") as ws,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        ws.receive_bytes()
    assert closed.value.code == CLOSE_RESERVED_PORT
    assert closed.value.reason == f"port {upper_server} is not the agent's server"
