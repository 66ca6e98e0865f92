"""A small server the integration tests and bench/previews.py run inside the sandbox as the agent
(standard library only, listening on 127.0.0.1 only: reached through the preview's tunnel or not at all).

``GET /`` a greeting, ``GET /headers`` what the server was sent (path and headers, as JSON),
``GET /big?n=N`` N bytes, ``GET /bye`` an answer on a connection the server closes 0.2 s later,
``POST /echo`` the body's size and SHA-256, ``GET /ws`` a WebSocket echo (RFC 6455 by hand: text
and binary messages sent back, a close answered).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def ws_frame(opcode: int, payload: bytes) -> bytes:
    head = bytes([0x80 | opcode])
    if len(payload) < 126:
        head += bytes([len(payload)])
    elif len(payload) < 1 << 16:
        head += bytes([126]) + struct.pack("!H", len(payload))
    else:
        head += bytes([127]) + struct.pack("!Q", len(payload))
    return head + payload


def ws_echo(sock: socket.socket) -> None:
    while True:
        first, second = read_exact(sock, 2)
        opcode, length = first & 0x0F, second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", read_exact(sock, 2))
        elif length == 127:
            (length,) = struct.unpack("!Q", read_exact(sock, 8))
        mask = read_exact(sock, 4) if second & 0x80 else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(sock, length)))
        if opcode == 0x8:
            sock.sendall(ws_frame(0x8, payload[:2]))
            return
        if opcode == 0x9:
            sock.sendall(ws_frame(0xA, payload))
        elif opcode in (0x1, 0x2):
            sock.sendall(ws_frame(opcode, payload))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # As servers that answer browsers do (node's, uvicorn's): a head and a body written apart are
        # not held back by Nagle waiting for the client's delayed ACK (40 ms a request otherwise).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, media: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("content-type", media)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/ws" and self.headers.get("upgrade", "").lower() == "websocket":
            key = self.headers["sec-websocket-key"]
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            self.send_response(101)
            self.send_header("upgrade", "websocket")
            self.send_header("connection", "Upgrade")
            self.send_header("sec-websocket-accept", accept)
            self.end_headers()
            self.wfile.flush()
            with contextlib.suppress(ConnectionError, OSError):
                ws_echo(self.connection)
            self.close_connection = True
            return
        if url.path == "/bye":  # answered kept alive, then closed 0.2 s later, as an idle server's timeout does
            self._send(200, b"bye")
            threading.Timer(0.2, self.connection.shutdown, [socket.SHUT_RDWR]).start()
            return
        if url.path == "/headers":
            seen = {"path": self.path, "headers": [[k.lower(), v] for k, v in self.headers.items()]}
            self._send(200, json.dumps(seen).encode(), "application/json")
            return
        if url.path == "/big":
            n = int(parse_qs(url.query).get("n", ["0"])[0])
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(n))
            self.end_headers()
            block = b"x" * 65536
            while n > 0:
                self.wfile.write(block[: min(n, len(block))])
                n -= len(block)
            return
        self._send(200, b"hello from the sandbox")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _chunks(self) -> Iterator[bytes]:
        """The body's bytes: by its length, or its chunks (Transfer-Encoding: chunked)."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                yield self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return
        left = int(self.headers.get("content-length", "0"))
        while left > 0 and (chunk := self.rfile.read(min(left, 65536))):
            left -= len(chunk)
            yield chunk

    def do_POST(self) -> None:
        digest, size = hashlib.sha256(), 0
        for chunk in self._chunks():
            digest.update(chunk)
            size += len(chunk)
        self._send(200, json.dumps({"size": size, "sha256": digest.hexdigest()}).encode(), "application/json")


def main() -> None:
    port = int(sys.argv[1])
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
