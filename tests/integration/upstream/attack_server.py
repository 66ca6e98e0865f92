"""A COPY of server.py with a malicious bound upstream's endpoints (``/atk/...``) for
test_secrets_attacks.py: it logs everything it receives (``RAW`` lines: headers and body, base64) so
a test can tell whether a secret's value reached a host, and reflects the value it was sent (the
``Authorization: Bearer`` token) back in the shapes named by the path.

The original's doc: a fake upstream for the egress tests: answers for any name over HTTP (80) and HTTPS (443), and
echoes UDP on 5353, so a test can tell whether anything got through. Each hit is one stdout line.

For the commands' tests it also serves, made at start: a package index for pip (``/simple/``),
a registry for npm (``/npm/``), a git repository over git's dumb HTTP protocol (``/git/``), and
``/headers``, the request's headers as JSON (what reached the upstream).

Runs inside a container on the test's egress network; the test gives it network aliases under
.test, so no real host is ever involved.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import pathlib
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import zipfile

HITS = iter(range(1, 1 << 30))
PAGES = pathlib.Path("/srv/pages")  # /counter pages show how often the upstream was asked


PROBE = "corral-probe"  # the package every index here serves, version 1.0(.0)
PROBE_VALUE = "served by the fake upstream"


def _wheel() -> tuple[str, bytes]:
    """A pure-Python wheel of corral-probe 1.0."""
    dist = "corral_probe-1.0.dist-info"
    files = {
        "corral_probe/__init__.py": f"VALUE = {PROBE_VALUE!r}\n\n\ndef main() -> None:\n    print(VALUE)\n".encode(),
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: corral-probe\nVersion: 1.0\n",
        f"{dist}/entry_points.txt": b"[console_scripts]\ncorral-probe = corral_probe:main\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: corral-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, data in {**files, f"{dist}/RECORD": (record + f"{dist}/RECORD,,\n").encode()}.items():
            wheel.writestr(name, data)
    return "corral_probe-1.0-py3-none-any.whl", buffer.getvalue()


def _npm_tarball() -> bytes:
    manifest = {"name": PROBE, "version": "1.0.0", "main": "index.js", "bin": {"corral-probe-js": "cli.js"}}
    files = {
        "package/package.json": json.dumps(manifest).encode(),
        "package/index.js": f"module.exports = {json.dumps(PROBE_VALUE)};\n".encode(),
        "package/cli.js": b"#!/usr/bin/env node\nconsole.log(require('./index.js'));\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith("cli.js") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _git_repository() -> pathlib.Path | None:
    """A bare repository with one commit, ready for git's dumb HTTP protocol (None without git)."""
    git = shutil.which("git")
    if git is None:
        return None
    root = pathlib.Path(tempfile.mkdtemp(prefix="upstream-git-"))
    env = {**os.environ, "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    work, bare = root / "work", root / "repo.git"
    ident = ["-c", "user.name=upstream", "-c", "user.email=upstream@upstream.test"]
    subprocess.run([git, "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text(PROBE_VALUE + "\n")
    subprocess.run([git, "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run([git, "-C", str(work), *ident, "commit", "-qm", "one"], check=True, env=env)
    subprocess.run([git, "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    subprocess.run([git, "-C", str(bare), "update-server-info"], check=True, env=env)
    return bare


WHEEL_NAME, WHEEL = _wheel()
NPM_TARBALL = _npm_tarball()
GIT_REPOSITORY = _git_repository()


def _package(path: str, host: str) -> tuple[bytes, str] | None:
    """What the package indexes answer for ``path`` (None: not theirs)."""
    path = path.split("?")[0]
    if path in ("/simple/", f"/simple/{PROBE}/"):
        digest = hashlib.sha256(WHEEL).hexdigest()
        link = f'<a href="/files/{WHEEL_NAME}#sha256={digest}">{WHEEL_NAME}</a>'
        return f"<!doctype html><html><body>{link}</body></html>".encode(), "text/html"
    if path == f"/files/{WHEEL_NAME}":
        return WHEEL, "application/octet-stream"
    if path == f"/npm/{PROBE}":
        tarball = f"https://{host}/npm/{PROBE}/-/{PROBE}-1.0.0.tgz"
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(NPM_TARBALL).digest()).decode()
        dist = {"tarball": tarball, "shasum": hashlib.sha1(NPM_TARBALL).hexdigest(), "integrity": integrity}
        version = {
            "name": PROBE,
            "version": "1.0.0",
            "main": "index.js",
            "bin": {"corral-probe-js": "cli.js"},
            "dist": dist,
        }
        packument = {"name": PROBE, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
        return json.dumps(packument).encode(), "application/json"
    if path == f"/npm/{PROBE}/-/{PROBE}-1.0.0.tgz":
        return NPM_TARBALL, "application/octet-stream"
    if path.startswith("/git/repo.git/") and GIT_REPOSITORY is not None:
        file = GIT_REPOSITORY.joinpath(path[len("/git/repo.git/") :]).resolve()
        if file.is_relative_to(GIT_REPOSITORY) and file.is_file():
            return file.read_bytes(), "application/octet-stream" if "/objects/" in path else "text/plain"
    return None


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
        trailers = b""
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            body, trailers = _chunked(self.rfile)
        host = (self.headers.get("host") or "").split(":")[0]
        tls = isinstance(self.connection, ssl.SSLSocket)
        hit = {"host": host, "method": self.command, "path": self.path, "tls": tls, "bytes": len(body)}
        print("HIT " + json.dumps(hit), flush=True)
        raw = {
            **hit,
            "headers": base64.b64encode(str(self.headers).encode("utf-8", "surrogateescape") + trailers).decode(),
            "body": base64.b64encode(body).decode(),
        }
        print("RAW " + json.dumps(raw), flush=True)
        if self.path.startswith("/atk/"):
            attack(self, body)
            return
        package, status = _package(self.path, host), 200
        if package is not None:
            payload, kind = package
        elif self.path.startswith("/git/"):
            payload, kind, status = b"", "text/plain", 404  # git asks for files a repository may lack
        elif self.path.startswith("/headers"):
            payload = json.dumps({name.lower(): value for name, value in self.headers.items()}).encode()
            kind = "application/json"
        elif self.path.startswith("/counter"):
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
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.send_header("set-cookie", "upstream=secret-cookie")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_HEAD = do_PUT = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


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
