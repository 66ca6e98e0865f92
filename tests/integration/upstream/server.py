"""A fake upstream for the egress tests: answers for any name over HTTP (80) and HTTPS (443), and
echoes UDP on 5353, so a test can tell whether anything got through. Each hit is one stdout line.

Runs inside a container on the test's egress network; the test gives it network aliases under
.test, so no real host is ever involved.
"""

from __future__ import annotations

import http.server
import json
import pathlib
import socket
import socketserver
import ssl
import sys
import threading

HITS = iter(range(1, 1 << 30))
PAGES = pathlib.Path("/srv/pages")  # /counter pages show how often the upstream was asked


def _page(path: str) -> bytes | None:
    name = path[len("/page/") :].split("?")[0]
    if "/" in name or name.startswith(".") or not PAGES.joinpath(name).is_file():
        return None
    return PAGES.joinpath(name).read_bytes()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        host = (self.headers.get("host") or "").split(":")[0]
        tls = isinstance(self.connection, ssl.SSLSocket)
        hit = {"host": host, "method": self.command, "path": self.path, "tls": tls, "bytes": len(body)}
        print("HIT " + json.dumps(hit), flush=True)
        if self.path.startswith("/counter"):
            count = next(HITS)  # shown as a number on a background of its own colour: any change is plain
            payload = (
                f"<!doctype html><html><head><title>counter</title></head>"
                f"<body style='background:hsl({count * 67 % 360},70%,50%)'>"
                f"<h1 id=count style='font-size:160px'>{count}</h1></body></html>"
            ).encode()
            kind = "text/html; charset=utf-8"
        elif self.path.startswith("/page/") and _page(self.path) is not None:
            # Test pages (an attacker's, for the inner-boundary tests), mounted from tests/integration/upstream/pages.
            payload = _page(self.path) or b""
            kind = "text/html; charset=utf-8"
        elif self.path.startswith("/download/"):
            # A file the browser saves rather than shows (the files tests find it in ~/Downloads).
            name = self.path[len("/download/") :].split("?")[0]
            payload = ("corral download " + name + "\n").encode() * 64
            kind = "application/octet-stream"
            self.send_response(200)
            self.send_header("content-disposition", f'attachment; filename="{name}"')
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        elif self.path.startswith("/json"):
            payload = json.dumps(hit).encode()
            kind = "application/json"
        else:
            payload = (
                f"<!doctype html><html><head><title>upstream {host}</title></head>"
                f"<body><h1 id=host>{host}</h1><p id=path>{self.path}</p></body></html>"
            ).encode()
            kind = "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.send_header("set-cookie", "upstream=secret-cookie")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_HEAD = do_PUT = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def udp_echo() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 5353))
    while True:
        data, peer = sock.recvfrom(2048)
        print("UDP " + json.dumps({"from": peer[0], "bytes": len(data)}), flush=True)
        sock.sendto(data, peer)


def main() -> None:
    cert, key = sys.argv[1], sys.argv[2]
    plain = Server(("0.0.0.0", 80), Handler)
    secure = Server(("0.0.0.0", 443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for target in (plain.serve_forever, secure.serve_forever, udp_echo):
        threading.Thread(target=target, daemon=True).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
