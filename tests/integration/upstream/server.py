"""A fake upstream for the egress tests: answers for any name over HTTP (80) and HTTPS (443), and
echoes UDP on 5353, so a test can tell whether anything got through. Each hit is one stdout line.

For the commands' tests it also serves, made at start: a package index for pip (``/simple/``),
a registry for npm (``/npm/``), a git repository over git's dumb HTTP protocol (``/git/``), and
``/headers``, the request's headers as JSON (what reached the upstream).

For the brokered secrets' tests: ``/echo``, what it received (method, path, query, headers, body) as
JSON (gzipped when the request accepts it), its Authorization header echoed back in
``x-echo-authorization`` too; ``/reflect``, an HTML page
whose title and body hold what it received (form fields, query, Authorization), as a careless site
would; and ``/login``, a form that POSTs a password field to ``/reflect``. Each of these also prints
what it received on a ``SEEN`` line: what reached the upstream, past the proxy. ``/ws/...`` is a
WebSocket echo (each text message printed on a ``WS`` line and sent back), and ``/chat/<tag>`` a page
that talks to it: it says hello, then sends what is typed in its field on Enter; its title says
how many characters it sent, what it heard, and when the socket closed.

Runs inside a container on the test's egress network; the test gives it network aliases under
.test, so no real host is ever involved.
"""

from __future__ import annotations

import base64
import gzip
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
SAYING = threading.Lock()


def say(line: str) -> None:
    """One line of the log the tests read, whole: requests are answered on threads of their own, and
    print() writes a line and its newline apart."""
    with SAYING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


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


LOGIN_PAGE = b"""<!doctype html><html><head><meta charset=utf-8><title>login</title><style>
html,body{margin:0;padding:0;background:#fff;font:16px sans-serif}
#password{position:absolute;left:40px;top:40px;width:480px;height:80px;border:0;outline:0;
  background:#0000ff;color:#fff;font-size:32px;caret-color:#fff}
#submit{position:absolute;left:40px;top:160px;width:240px;height:80px;border:0;background:#00c800}
</style></head><body><form method=post action=/reflect>
<input id=password name=password type=password autocomplete=off>
<button id=submit type=submit></button></form></body></html>"""


CHAT_PAGE = b"""<!doctype html><html><head><meta charset=utf-8><title>chat</title><style>
html,body{margin:0;padding:0;background:#fff;font:16px sans-serif}
#message{position:absolute;left:40px;top:40px;width:480px;height:80px;border:0;outline:0;
  background:#0000ff;color:#fff;font-size:32px;caret-color:#fff}
</style></head><body><input id=message autocomplete=off><script>
const heard = [];
let sent = null, closed = false;
const show = () => {
  document.title = (closed ? "closed; " : "") + (sent === null ? "" : `sent ${sent}; `) + "heard " + heard.join(" ");
};
const socket = new WebSocket("wss://" + location.host + "/ws" + location.pathname.slice("/chat".length));
socket.onopen = () => socket.send("hello");
socket.onmessage = (event) => { heard.push(event.data); show(); };
socket.onclose = () => { closed = true; show(); };
document.getElementById("message").addEventListener("keydown", (event) => {
  if (event.key !== "Enter") return;
  sent = event.target.value.length;
  show();
  socket.send(event.target.value);
});
</script></body></html>"""
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _read_frame(stream: io.BufferedIOBase) -> tuple[int, bytes] | None:
    """One WebSocket frame (RFC 6455): its opcode and unmasked payload; None at the end."""
    head = stream.read(2)
    if len(head) < 2:
        return None
    length = head[1] & 0x7F
    if length >= 126:
        length = int.from_bytes(stream.read(2 if length == 126 else 8), "big")
    mask = stream.read(4) if head[1] & 0x80 else bytes(4)
    payload = stream.read(length)
    return head[0] & 0x0F, bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))


def _text_frame(payload: bytes) -> bytes:
    size = len(payload)
    head = bytes([0x81, size]) if size < 126 else bytes([0x81, 126]) + size.to_bytes(2, "big")
    return head + payload


def _seen(handler: http.server.BaseHTTPRequestHandler, body: bytes) -> dict[str, object]:
    """What reached the upstream, as /echo answers it (and as its SEEN line says)."""
    query = urllib.parse.urlsplit(handler.path).query
    compressed = handler.headers.get("content-encoding", "").lower() == "gzip"
    text = (gzip.decompress(body) if compressed else body).decode(errors="replace")
    return {
        "method": handler.command,
        "path": handler.path.split("?")[0],
        "raw_query": query,
        "query": urllib.parse.parse_qs(query, keep_blank_values=True),
        "headers": {name.lower(): value for name, value in handler.headers.items()},
        "body": text,  # decompressed when it came gzipped
        "body_base64": base64.b64encode(body).decode(),  # as it came
    }


def _reflection(seen: dict[str, object]) -> bytes:
    """A page that puts what it received in its title and body, unescaped: a reflecting site."""
    fields: list[str] = []
    headers = seen["headers"]
    assert isinstance(headers, dict)
    if "application/x-www-form-urlencoded" in headers.get("content-type", ""):
        form = urllib.parse.parse_qsl(str(seen["body"]), keep_blank_values=True)
        fields += [f"{name}={value}" for name, value in form]
    fields += [f"{name}={value}" for name, value in urllib.parse.parse_qsl(str(seen["raw_query"]))]
    if "authorization" in headers:
        fields.append(f"authorization={headers['authorization']}")
    said = " ".join(fields)
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>reflected {said}</title></head>"
        f"<body><h1 id=said>{said}</h1><p id=query>{seen['raw_query']}</p></body></html>"
    ).encode()


def _page(path: str) -> bytes | None:
    name = path[len("/page/") :].split("?")[0]
    if "/" in name or name.startswith(".") or not PAGES.joinpath(name).is_file():
        return None
    return PAGES.joinpath(name).read_bytes()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _intercepted(self, hit: dict[str, object], body: bytes) -> bool:
        """A hook for a variant of this upstream (attack_server.py): True when it answered the request itself."""
        return False

    def _answer(self) -> None:
        body = self._read_body()
        host = (self.headers.get("host") or "").split(":")[0]
        tls = isinstance(self.connection, ssl.SSLSocket)
        hit = {"host": host, "method": self.command, "path": self.path, "tls": tls, "bytes": len(body)}
        say("HIT " + json.dumps(hit))
        if self._intercepted(hit, body):
            return
        if self.path.startswith("/ws") and self.headers.get("upgrade", "").lower() == "websocket":
            self._echo_websocket()
            return
        package, status = _package(self.path, host), 200
        extra_headers: dict[str, str] = {}
        if self.path.startswith(("/echo", "/reflect")):
            seen = _seen(self, body)
            say("SEEN " + json.dumps(seen))
        if package is not None:
            payload, kind = package
        elif self.path.startswith("/git/"):
            payload, kind, status = b"", "text/plain", 404  # git asks for files a repository may lack
        elif self.path.startswith("/headers"):
            payload = json.dumps({name.lower(): value for name, value in self.headers.items()}).encode()
            kind = "application/json"
        elif self.path.startswith("/echo"):
            payload, kind = json.dumps(seen).encode(), "application/json"
            if "authorization" in self.headers:
                extra_headers["x-echo-authorization"] = self.headers["authorization"]
            if "gzip" in self.headers.get("accept-encoding", ""):  # compressed only when asked
                payload, extra_headers["content-encoding"] = gzip.compress(payload), "gzip"
        elif self.path.startswith("/reflect"):
            payload, kind = _reflection(seen), "text/html; charset=utf-8"
        elif self.path.split("?")[0] == "/login":
            payload, kind = LOGIN_PAGE, "text/html; charset=utf-8"
        elif self.path.startswith("/chat/"):
            payload, kind = CHAT_PAGE, "text/html; charset=utf-8"
        elif self.path.startswith("/slow/"):
            # A page that takes its time to come (``/slow/<ms>?tag``, at most 5 s): a form's next page,
            # as a real site answers it. A screenshot taken before it arrived shows the page before.
            delay_ms, _, tag = self.path[len("/slow/") :].partition("?")
            time.sleep(min(int(delay_ms or 0), 5_000) / 1000)
            payload = (
                f"<!doctype html><html><head><title>moved {tag}</title></head>"
                f"<body style='margin:0;background:#c03020'><h1 style='font-size:120px;color:#fff'>moved</h1>"
                f"</body></html>"
            ).encode()
            kind = "text/html; charset=utf-8"
        elif self.path.startswith("/counter"):
            count = next(HITS)  # shown as a number on a background of its own colour: any change is plain
            payload = (
                f"<!doctype html><html><head><title>counter</title></head>"
                f"<body style='background:hsl({count * 67 % 360},70%,50%)'>"
                f"<h1 id=count style='font-size:160px'>{count}</h1></body></html>"
            ).encode()
            kind = "text/html; charset=utf-8"
        elif self.path.startswith("/page/") and _page(self.path) is not None:
            # Test pages (an attacker's, for the inner-boundary tests), mounted from tests/integration/upstream/pages,
            # and the scripts they share.
            payload = _page(self.path) or b""
            script = self.path.split("?")[0].endswith(".js")
            kind = "text/javascript; charset=utf-8" if script else "text/html; charset=utf-8"
        elif self.path.startswith("/download/"):
            # A file the browser saves rather than shows (the files tests find it in ~/Downloads).
            name, _, query = self.path[len("/download/") :].partition("?")
            payload = ("corral download " + name + "\n").encode() * 64
            size = urllib.parse.parse_qs(query).get("bytes", [""])[0]
            if size.isdigit():  # ?bytes=N: a file of N bytes (the downloads tests' caps)
                payload = (payload * (int(size) // len(payload) + 1))[: int(size)]
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
        for name, value in extra_headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _echo_websocket(self) -> None:
        """Accept the upgrade (no extension), then echo text messages until the socket closes."""
        key = self.headers["sec-websocket-key"] + WEBSOCKET_GUID
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.close_connection = True
        while (frame := _read_frame(self.rfile)) is not None:
            opcode, payload = frame
            if opcode == 0x8:  # close: answer it, and done
                self.wfile.write(b"\x88\x00")
                return
            if opcode == 0x1:
                say("WS " + json.dumps({"path": self.path, "text": payload.decode(errors="replace")}))
                self.wfile.write(_text_frame(payload))
                self.wfile.flush()

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
        say("UDP " + json.dumps({"from": peer[0], "bytes": len(data)}))
        sock.sendto(data, peer)


def main(handler: type[Handler] = Handler) -> None:
    cert, key = sys.argv[1], sys.argv[2]
    plain = Server(("0.0.0.0", 80), handler)
    secure = Server(("0.0.0.0", 443), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for target in (plain.serve_forever, secure.serve_forever, udp_echo):
        threading.Thread(target=target, daemon=True).start()
    say("READY")
    threading.Event().wait()


if __name__ == "__main__":
    main()
