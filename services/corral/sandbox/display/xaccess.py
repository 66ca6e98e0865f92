"""Who may use the X server, and how much: the controller is trusted, the browser is trusted, the
agent's programs are untrusted clients (the X SECURITY extension, as ``ssh -X`` makes them).

- Boot (root) writes a fresh MIT-MAGIC-COOKIE-1 into :data:`CONTROLLER_XAUTH`, 0400 for ``corral``:
  Xvfb's ``-auth`` (so it takes no client without a cookie or a listed uid, on its socket file and its
  abstract socket alike; it listens on no TCP port) and the controller's ``XAUTHORITY``.
- The init, a trusted client for a moment right after Xvfb is up (:func:`open_door`), lets the
  browser's uid in by name (``SI:localuser:browser``, checked by the kernel's peer credentials, so
  no cookie the browser could read, or be made to show a page, exists), and asks the SECURITY
  extension for an *untrusted* cookie that never expires, written to :data:`AGENT_XAUTH` (0444):
  the ``XAUTHORITY`` of the agent's programs. An untrusted client may open windows but sees no
  extension beyond BIG-REQUESTS and XC-MISC (no XTEST to inject input, no RECORD to log it) and may
  not read other clients' windows or the root window's pixels (``GetImage`` is ``BadAccess``).
- Xvfb runs with ``-noreset``: a server reset (its last client gone) would forget both.

The wire format is X11's own, little-endian, built and read here with ``struct`` alone: the init
lives as long as the sandbox does, and python-xlib would be megabytes of every idle sandbox.
"""

from __future__ import annotations

import os
import socket
import struct

from corral.errors import XDoorError

# Strings, not pathlib: the init imports this module and lives as long as the sandbox does.
XAUTH_DIR = "/run/corral/x11"  # boot makes it, corral's, 0755
CONTROLLER_XAUTH = f"{XAUTH_DIR}/controller"  # trusted: corral's alone
AGENT_XAUTH = f"{XAUTH_DIR}/agent"  # untrusted: anyone's to read
COOKIE_NAME = b"MIT-MAGIC-COOKIE-1"
FAMILY_LOCAL = 256  # an Xauthority entry for a hostname's local connections
FAMILY_WILD = 0xFFFF  # any address (libX11 honours it; python-xlib reads only FamilyLocal)
FAMILY_SERVER_INTERPRETED = 5  # ChangeHosts: "localuser" + NUL + a user name
SECURITY_UNTRUSTED = 1
_OPCODE_QUERY_EXTENSION, _OPCODE_CHANGE_HOSTS = 98, 109
_SECURITY_GENERATE_AUTHORIZATION = 1
_TIMEOUT_MASK, _TRUST_LEVEL_MASK = 0x1, 0x2
_IO_TIMEOUT_S = 5.0


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _counted(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def xauthority(hostname: str, display_number: int, cookie: bytes) -> bytes:
    """An Xauthority file's bytes: the cookie for ``display_number`` on this host's local connections,
    and again for any address."""
    number = str(display_number).encode()
    entries = b""
    for family, address in ((FAMILY_LOCAL, hostname.encode()), (FAMILY_WILD, b"")):
        entries += struct.pack(">H", family) + _counted(address) + _counted(number)
        entries += _counted(COOKIE_NAME) + _counted(cookie)
    return entries


def cookie_of(xauthority_bytes: bytes) -> bytes:
    """The first MIT-MAGIC-COOKIE-1 in an Xauthority file; raises ValueError if there is none."""
    at = 0
    while at + 2 <= len(xauthority_bytes):
        at += 2  # family
        fields = []
        for _ in range(4):
            if at + 2 > len(xauthority_bytes):
                raise ValueError("a truncated Xauthority entry")
            (length,) = struct.unpack_from(">H", xauthority_bytes, at)
            fields.append(xauthority_bytes[at + 2 : at + 2 + length])
            at += 2 + length
        if fields[2] == COOKIE_NAME and len(fields[3]) == 16:
            return fields[3]
    raise ValueError("no MIT-MAGIC-COOKIE-1 in the Xauthority file")


def setup_request(cookie: bytes) -> bytes:
    """The connection setup, little-endian, protocol 11.0, with the cookie."""
    head = struct.pack("<BxHHHHxx", 0x6C, 11, 0, len(COOKIE_NAME), len(cookie))
    return head + _padded(COOKIE_NAME) + _padded(cookie)


def change_hosts_request(user: str) -> bytes:
    """ChangeHosts Insert of ``SI:localuser:<user>``."""
    address = b"localuser\0" + user.encode()
    length = 2 + len(_padded(address)) // 4
    return struct.pack("<BBHBxH", _OPCODE_CHANGE_HOSTS, 0, length, FAMILY_SERVER_INTERPRETED, len(address)) + _padded(
        address
    )


def query_extension_request(name: bytes) -> bytes:
    return struct.pack("<BxHHxx", _OPCODE_QUERY_EXTENSION, 2 + len(_padded(name)) // 4, len(name)) + _padded(name)


def generate_untrusted_request(security_opcode: int) -> bytes:
    """SecurityGenerateAuthorization: an untrusted MIT-MAGIC-COOKIE-1 the server makes up, timeout 0
    (never expires; a timeout would revoke it once no client has used it for that long)."""
    name = _padded(COOKIE_NAME)
    values = struct.pack("<II", 0, SECURITY_UNTRUSTED)
    length = 3 + len(name) // 4 + len(values) // 4
    head = struct.pack(
        "<BBHHHI",
        security_opcode,
        _SECURITY_GENERATE_AUTHORIZATION,
        length,
        len(COOKIE_NAME),
        0,
        _TIMEOUT_MASK | _TRUST_LEVEL_MASK,
    )
    return head + name + values


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise XDoorError("the X server closed the connection")
        data += chunk
    return data


def _accepted(conn: socket.socket) -> None:
    head = _read_exactly(conn, 8)
    (extra,) = struct.unpack_from("<H", head, 6)
    body = _read_exactly(conn, extra * 4)
    if head[0] != 1:
        reason = body[: head[1]].decode(errors="replace").strip() if head[0] == 0 else "more authentication asked"
        raise XDoorError(f"the X server refused the trusted cookie: {reason}")


def _reply(conn: socket.socket, what: str) -> bytes:
    """The next reply, whole; an X error raises (a request without a reply reports only errors)."""
    while True:
        head = _read_exactly(conn, 32)
        if head[0] == 0:
            raise XDoorError(f"the X server refused {what} (error {head[1]}, request {head[10]})")
        if head[0] == 1:
            (extra,) = struct.unpack_from("<I", head, 4)
            return head + _read_exactly(conn, extra * 4)
        # An event: none is asked for; pass it over.


def open_door(socket_path: str, trusted_cookie: bytes, browser_user: str) -> bytes:
    """Let ``browser_user`` in by uid and return a new untrusted cookie, as a trusted client."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_IO_TIMEOUT_S)
        conn.connect(socket_path)
        conn.sendall(setup_request(trusted_cookie))
        _accepted(conn)
        conn.sendall(change_hosts_request(browser_user) + query_extension_request(b"SECURITY"))
        present, opcode = struct.unpack_from("<BB", _reply(conn, "the browser's uid or the extension query"), 8)
        if not present:
            raise XDoorError("the X server has no SECURITY extension")
        conn.sendall(generate_untrusted_request(opcode))
        reply = _reply(conn, "an untrusted cookie")
        (length,) = struct.unpack_from("<H", reply, 12)
        cookie = reply[32 : 32 + length]
    if len(cookie) != 16:
        raise XDoorError(f"the X server made a cookie of {len(cookie)} bytes")
    return cookie


def write_public(path: str, data: bytes) -> None:
    """``data`` in ``path``, 0444, whole or not at all (a temporary file renamed over it)."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.tmp")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        os.write(fd, data)
        os.fchmod(fd, 0o444)
    finally:
        os.close(fd)
    os.replace(temporary, path)
