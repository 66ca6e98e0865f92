"""The X server's door, on the wire: the requests the init sends as bytes (checked against
python-xlib's own encoding of the same requests) and the Xauthority file as xauth(1) reads it."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from Xlib.ext import security
from Xlib.protocol import request

from corral.errors import XDoorError
from corral.sandbox.display import xaccess

COOKIE = bytes(range(16))


def test_the_requests_are_the_ones_python_xlib_would_send() -> None:
    assert xaccess.change_hosts_request("browser") == request.ChangeHosts._request.to_binary(
        mode=0, host_family=5, host=list(b"localuser\0browser")
    )
    assert xaccess.query_extension_request(b"SECURITY") == request.QueryExtension._request.to_binary(name="SECURITY")
    expected = security.SecurityGenerateAuthorization._request.to_binary(
        opcode=130, auth_proto="MIT-MAGIC-COOKIE-1", auth_data=b"", value_mask=3, values=[0, 1]
    )
    assert xaccess.generate_untrusted_request(130) == expected  # timeout 0 (never), untrusted


def test_the_setup_carries_the_cookie_padded() -> None:
    setup = xaccess.setup_request(COOKIE)
    assert setup[:12] == struct.pack("<BxHHHHxx", 0x6C, 11, 0, 18, 16)
    assert setup[12:32] == b"MIT-MAGIC-COOKIE-1\0\0" and setup[32:] == COOKIE


@pytest.mark.skipif(shutil.which("xauth") is None, reason="xauth(1) is not installed here")
def test_xauth_reads_the_file_boot_writes(tmp_path: Path) -> None:
    path = tmp_path / "auth"
    path.write_bytes(xaccess.xauthority("box", 0, COOKIE))
    listed = subprocess.run(["xauth", "-f", str(path), "list"], capture_output=True, text=True, check=True).stdout
    assert listed.split("\n")[:2] == [
        f"box/unix:0  MIT-MAGIC-COOKIE-1  {COOKIE.hex()}",
        f"#ffff##:0  MIT-MAGIC-COOKIE-1  {COOKIE.hex()}",
    ]
    assert xaccess.cookie_of(path.read_bytes()) == COOKIE
    with pytest.raises(ValueError):
        xaccess.cookie_of(b"\x01\x00\x00\x03ab")


def test_the_agents_file_is_whole_and_readable_by_all(tmp_path: Path) -> None:
    path = tmp_path / "agent"
    path.write_bytes(b"old")
    xaccess.write_public(str(path), b"new")
    assert path.read_bytes() == b"new" and (path.stat().st_mode & 0o777) == 0o444
    assert [p.name for p in tmp_path.iterdir()] == ["agent"]


def _fake_server(path: Path, answers: list[bytes], received: list[bytes]) -> threading.Thread:
    """A stand-in X server on a unix socket: reads what comes, sends ``answers`` in turn."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            for answer in answers:
                received.append(conn.recv(65536))
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _reply(body: bytes, extra: bytes = b"") -> bytes:
    return struct.pack("<BxHI", 1, 1, len(extra) // 4) + body.ljust(24, b"\0") + extra


def test_the_door_asks_for_the_browser_and_an_untrusted_cookie(tmp_path: Path) -> None:
    accepted = struct.pack("<BxHHH", 1, 11, 0, 2) + b"\0" * 8
    security_present = _reply(struct.pack("<BBBB", 1, 131, 0, 0))
    made = _reply(struct.pack("<IH", 7, 16), COOKIE)
    received: list[bytes] = []
    server = _fake_server(tmp_path / "X0", [accepted, security_present, made], received)
    assert xaccess.open_door(str(tmp_path / "X0"), COOKIE, "browser") == COOKIE
    server.join(5)
    assert received[0] == xaccess.setup_request(COOKIE)
    assert received[1] == xaccess.change_hosts_request("browser") + xaccess.query_extension_request(b"SECURITY")
    assert received[2] == xaccess.generate_untrusted_request(131)


def test_a_refused_cookie_or_a_missing_extension_is_an_error(tmp_path: Path) -> None:
    reason = b"Invalid MIT-MAGIC-COOKIE-1 key"
    refused = struct.pack("<BBHHH", 0, len(reason), 11, 0, 8) + reason.ljust(32, b"\0")
    _fake_server(tmp_path / "X0", [refused], [])
    with pytest.raises(XDoorError, match="Invalid MIT-MAGIC-COOKIE-1 key"):
        xaccess.open_door(str(tmp_path / "X0"), COOKIE, "browser")
    accepted = struct.pack("<BxHHH", 1, 11, 0, 0)
    error = struct.pack("<BBH", 0, 10, 1).ljust(32, b"\0")  # BadAccess for ChangeHosts
    _fake_server(tmp_path / "X1", [accepted, error], [])
    with pytest.raises(XDoorError, match="error 10"):
        xaccess.open_door(str(tmp_path / "X1"), COOKIE, "browser")
