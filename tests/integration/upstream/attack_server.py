"""A malicious bound upstream for test_secrets_attacks.py: the fake upstream of server.py (imported from beside
it) plus endpoints of its own (``/atk/...``). It logs everything it receives (``RAW`` lines: headers and body,
base64) so a test can tell whether a secret's value reached a host, and reflects the value it was sent (the
``Authorization: Bearer`` token) back in the shapes named by the path.

Runs inside a container on the test's egress network, server.py mounted beside it; the test gives it network
aliases under .test, so no real host is ever involved.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import time
import urllib.parse

try:
    from . import server  # imported by the tests (test_secrets_attacks.py reads its reflected forms)
except ImportError:
    import server  # run as a script in the upstream's container, server.py beside it


def _chunked(rfile: io.BufferedIOBase) -> tuple[bytes, bytes]:
    """A chunked body and its trailer lines (what the proxy forwarded after the last chunk)."""
    body = b""
    while True:
        size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        body += rfile.read(size)
        rfile.readline()
    trailers = b""
    while True:
        line = rfile.readline()
        if line in (b"\r\n", b"\n", b""):
            return body, trailers
        trailers += line


_BOMB: list[bytes] = []
STORED: list[bytes] = []


def _bomb() -> bytes:
    if not _BOMB:
        import gzip

        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as zipped:
            block = bytes(1 << 20)
            for _ in range(1536):
                zipped.write(block)
        _BOMB.append(out.getvalue())
    return _BOMB[0]


def _token(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """What a reflecting upstream hands back: the Bearer token it was sent (the substituted value)."""
    auth = handler.headers.get("authorization") or ""
    return auth.partition(" ")[2].encode()


def _reflected(form: str, value: bytes) -> bytes:
    import gzip
    import urllib.parse

    if form == "plain":
        return value
    if form == "lowerpct":  # percent-encoding with lowercase hex digits (RFC 3986 allows both)
        import re

        quoted = urllib.parse.quote(value, safe="").encode()
        return re.sub(rb"%[0-9A-F]{2}", lambda match: match.group().lower(), quoted)
    if form == "hex":
        return value.hex().encode()
    if form == "entities":  # numeric character references, as many HTML templating engines write
        return "".join(f"&#{b};" for b in value).encode()
    if form == "jsonu":  # every character \u-escaped (legal JSON, some serialisers do it)
        return json.dumps({"t": "".join(f"\\u{b:04x}" for b in value)}).encode().replace(b"\\\\", b"\\")
    if form == "jsuri":  # JavaScript's encodeURIComponent: leaves !'()* as they are
        return urllib.parse.quote(value, safe="!'()*").encode()
    if form == "gojson":  # Go's encoding/json: <, > and & as \\u003c, \\u003e, \\u0026
        text = json.dumps(value.decode())
        for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
            text = text.replace(char, escape)
        return text.encode()
    if form == "upper":
        return value.upper()
    if form == "b64mime":  # base64 wrapped at 4 characters a line
        encoded = base64.b64encode(value)
        return b"\r\n".join(encoded[i : i + 4] for i in range(0, len(encoded), 4))
    if form == "partialjson":  # JSON with a few characters \u-escaped (legal, and decoded by any JSON reader)
        text = value.decode()
        return (
            json.dumps({"t": "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(text))})
            .encode()
            .replace(b"\\\\", b"\\")
        )
    if form == "partialhtml":  # some characters as &#NN;, &#xNN; or a named entity (a browser shows the text)
        named = {"!": "&excl;", "&": "&amp;", "<": "&lt;", "/": "&sol;", "+": "&plus;"}
        out = []
        for i, c in enumerate(value.decode()):
            out.append(named.get(c) or (f"&#{ord(c)};" if i % 4 == 0 else f"&#x{ord(c):X};" if i % 4 == 2 else c))
        return "".join(out).encode()
    if form == "partialpct":  # a few characters percent-encoded, the others as they are
        return "".join(f"%{ord(c):02X}" if i % 2 else c for i, c in enumerate(value.decode())).encode()
    if form == "mixedescapes":  # one value, three escapes: percent, JSON and HTML, in turn
        escapes = (lambda c: f"%{ord(c):02x}", lambda c: f"\\u{ord(c):04X}", lambda c: f"&#{ord(c)};", str)
        return "".join(escapes[i % 4](c) for i, c in enumerate(value.decode())).encode()
    if form == "gzipped":  # a gzip file served as data (no Content-Encoding): the client gunzips it
        return gzip.compress(value)
    return b""


def attack(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
    value = _token(handler)
    path = handler.path.split("?")[0]
    write = handler.wfile.write
    if path.startswith("/atk/reflect/"):
        payload = b"reflected:" + _reflected(path[len("/atk/reflect/") :], value) + b":end"
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n")
        write(b"content-length: %d\r\n\r\n" % len(payload) + payload)
    elif path == "/atk/header-name":  # the value as a header's name
        write(b"HTTP/1.1 200 OK\r\nx-leak-" + value + b": 1\r\ncontent-length: 2\r\n\r\nok")
    elif path == "/atk/trailer":  # the value in a chunked answer's trailer
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n")
        write(b"trailer: x-leak\r\n\r\n2\r\nok\r\n0\r\nx-leak: " + value + b"\r\n\r\n")
    elif path == "/atk/bad-header-line":  # a header line without a colon: the proxy's parser quotes it
        write(b"HTTP/1.1 200 OK\r\nx-leak " + value + b"\r\ncontent-length: 2\r\n\r\nok")
    elif path == "/atk/bad-status-line":  # a status line the proxy's parser quotes
        write(b"HTTP/1.1 2OO " + value + b"\r\ncontent-length: 2\r\n\r\nok")
    elif path == "/atk/cut":  # headers, then the value, then the connection closes mid-answer
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 100000\r\n\r\n" + value)
    elif path == "/atk/reflect-headers":  # Set-Cookie, Location and a header of its own
        write(b"HTTP/1.1 302 Found\r\nset-cookie: s=" + value + b"; Path=/\r\nlocation: https://other.test/?t=")
        write(urllib.parse.quote(value, safe="").encode() + b"\r\nx-echo: " + value + b"\r\ncontent-length: 0\r\n\r\n")
    elif path in ("/atk/gzip", "/atk/deflate"):  # the value in a compressed body
        import gzip
        import zlib

        packed = gzip.compress(b"zipped:" + value) if path.endswith("gzip") else zlib.compress(b"zipped:" + value)
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: " + path[5:].encode() + b"\r\n")
        write(b"content-length: %d\r\n\r\n" % len(packed) + packed)
    elif path in ("/atk/gzip-members", "/atk/deflate-streams"):  # the value in a second member/stream
        import gzip
        import zlib

        pack = gzip.compress if path == "/atk/gzip-members" else zlib.compress
        packed = pack(b"first member, nothing to see;") + pack(b"second:" + value + b":end")
        coding = b"gzip" if path == "/atk/gzip-members" else b"deflate"
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: " + coding + b"\r\n")
        write(b"content-length: %d\r\n\r\n" % len(packed) + packed)
    elif path == "/atk/gzip-garbage":  # one gzip member, then bytes that are none
        import gzip

        packed = gzip.compress(b"first member;") + b"\x1f\x8b\x08garbage" + value
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: gzip\r\n")
        write(b"content-length: %d\r\n\r\n" % len(packed) + packed)
    elif path == "/atk/split":  # the value cut across two chunks
        half = len(value) // 2
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (value[:half], value[half:]):
            write(b"%x\r\n" % len(part) + part + b"\r\n")
            handler.wfile.flush()
            time.sleep(0.3)
        write(b"0\r\n\r\n")
    elif path == "/atk/store":  # keeps the token it was sent (a service that stores a credential)
        STORED[:] = [value]
        write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
    elif path == "/atk/recall":  # shows it again later, asked without it (say, an account's settings page)
        payload = b"stored:" + (STORED[0] if STORED else b"") + b":end"
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
    elif path == "/atk/bomb":  # 1.5 GB of zeros, gzip-encoded (about 1.5 MB on the wire)
        payload = _bomb()
        write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: gzip\r\n")
        write(b"content-length: %d\r\n\r\n" % len(payload) + payload)
    elif path == "/atk/redirect":  # an open redirect on a bound host
        target = (handler.headers.get("x-to") or "https://other.test/").encode()
        write(b"HTTP/1.1 302 Found\r\nlocation: " + target + b"\r\ncontent-length: 0\r\n\r\n")
    else:
        write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
    handler.wfile.flush()
    handler.close_connection = True


class Handler(server.Handler):
    """server.py's handler, which also reads chunked bodies (and their trailers), logs each request whole on a
    ``RAW`` line, and answers ``/atk/...`` itself."""

    trailers = b""

    def _read_body(self) -> bytes:
        body, self.trailers = super()._read_body(), b""
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            body, self.trailers = _chunked(self.rfile)
        return body

    def _intercepted(self, hit: dict[str, object], body: bytes) -> bool:
        raw = {
            **hit,
            "headers": base64.b64encode(str(self.headers).encode("utf-8", "surrogateescape") + self.trailers).decode(),
            "body": base64.b64encode(body).decode(),
        }
        server.say("RAW " + json.dumps(raw))
        if not self.path.startswith("/atk/"):
            return False
        attack(self, body)
        return True


if __name__ == "__main__":
    server.main(Handler)
