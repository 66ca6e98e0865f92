"""A small web app the agent serves inside the sandbox for the preview tests (standard library only:
it runs on the image's own python3 as the agent): ``/`` a page titled ``preview-app <port>``,
``/cookie`` sets a cookie of the app's own, ``/ws`` a WebSocket that echoes each text message,
``/wspage`` a page that opens it and shows the echo as its title, ``/bytes/N`` N bytes.

    python3 app.py PORT
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import socketserver
import struct
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _frame(payload: bytes, opcode: int = 1) -> bytes:
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload


def _read_frame(stream) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    first, second = stream.read(2)
    opcode, size = first & 0x0F, second & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", stream.read(2))
    elif size == 127:
        (size,) = struct.unpack("!Q", stream.read(8))
    mask = stream.read(4) if second & 0x80 else b"\0\0\0\0"
    data = stream.read(size)
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/ws" and self.headers.get("upgrade", "").lower() == "websocket":
            accept = base64.b64encode(hashlib.sha1(self.headers["sec-websocket-key"].encode() + GUID).digest())
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept.decode())
            self.end_headers()
            self.wfile.flush()
            while True:
                opcode, data = _read_frame(self.rfile)
                if opcode == 8:
                    self.wfile.write(_frame(data[:2], 8))
                    return
                self.wfile.write(_frame(b"echo:" + data, opcode))
                self.wfile.flush()
        if self.path.startswith("/bytes/"):  # N bytes, for throughput
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = b"x" * 65536
            while size > 0:
                self.wfile.write(block[: min(size, len(block))])
                size -= len(block)
            return
        seen = self.headers.get("cookie", "")
        body = (
            f"<!doctype html><title>preview-app {port}</title>"
            f"<p id=host>{self.headers.get('host')}</p><p id=cookies>{seen}</p>"
        ).encode()
        if self.path == "/wspage":  # the page's own WebSocket, its echo shown as the title
            body = (
                b"<!doctype html><title>ws waiting</title><script>"
                b"const ws = new WebSocket('ws://' + location.host + '/ws');"
                b"ws.onopen = () => ws.send('hi from the page');"
                b"ws.onmessage = (event) => { document.title = 'ws ' + event.data; };"
                b"ws.onerror = () => { document.title = 'ws failed'; };"
                b"</script>"
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/cookie":
            self.send_header("Set-Cookie", f"app{port}=kept; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), App).serve_forever()
