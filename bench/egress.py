"""Egress proxy benchmark: what Corral's sidecar (mitmproxy + Corral's addon: policy, pinning, audit
log) costs per request, against bare ``mitmdump`` (same image, same options, no addon) and no proxy.

All three face the same fake upstream (a container on a network of the bench's own, names under
.test) in one run; the client runs on the host. The three take turns request by request (connection
by connection, run by run for requests/s) in a rotating order, so bursts of load from elsewhere on a
shared machine fall on all of them alike; percentiles are over all samples.

- HTTPS on a kept-alive connection (through a CONNECT tunnel; direct: one kept-alive TLS connection)
- plain HTTP on a kept-alive connection (absolute-form through the proxies)
- a new TLS-intercepted connection: CONNECT, TLS handshake, one GET, close
- requests/s of one proxy: several client processes on kept-alive HTTPS connections at once

A fourth target is a second Corral sidecar holding one brokered secret (docs/secrets.md), sent the
`secrets` control op as the gateway sends it; every request to it carries the secret's placeholder in
``Authorization: Bearer``, bound to the upstream, so the proxy substitutes the value on each one
(an unsubstituted or refused request fails the bench: the upstream checks the value it gets). Against
the plain sidecar, turn by turn like the others: then a 1 MB answer through both with 1 secret loaded,
and again with 32, for the cost of scanning answers for reflected values.

Budgets: the sidecar within 15% of bare mitmdump on every HTTPS figure; the sidecar substituting a
secret on every request at least 0.90 of the plain sidecar's requests/s, and at most 0.3 ms added to
its p50 per kept-alive HTTPS request. Prints a table and writes bench/results/egress.json; exits
non-zero when a budget is missed or a sidecar's audit log does not hold every request (and every
substitution).

    .venv/bin/python bench/egress.py [--rounds 6] [--requests 150] [--connections 50] [--workers 4] [--seconds 1.5]
        [--scan-requests 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' PKI for the upstream

from tests.integration.dockerutil import DockerHarness  # noqa: E402
from tests.integration.egress_fixtures import UPSTREAM_NAMES, write_test_pki  # noqa: E402

from corral import images  # noqa: E402
from corral.contracts.control import PutSecrets, SecretEntry  # noqa: E402
from corral.contracts.placeholders import new_placeholder  # noqa: E402
from corral.gateway.egress import Egress, EgressManager  # noqa: E402
from corral.gateway.settings import GatewaySettings  # noqa: E402
from corral.proxy import audit, ca  # noqa: E402
from corral.proxy.control import call_blocking  # noqa: E402
from corral.proxy.flowfile import FlowFile, check  # noqa: E402
from corral.proxy.sidecar import PROXY_PORT, mitmdump_argv  # noqa: E402
from corral.runtime import ProxySpec, SessionNetwork  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "allowed.test"
BUDGET = 1.15  # the sidecar's latency may be at most 15% over bare mitmdump's
# Its requests/s at least this share of bare mitmdump's: 1/1.15 for the policy and the audit log,
# less about 0.05 for also keeping every response for hermetic replays (measured side by side).
THROUGHPUT_FLOOR = 0.80
# Issue 14's budgets for a brokered secret substituted on every request, against the same sidecar
# holding none: requests/s (best turn, as above) at least this share, p50 (kept-alive HTTPS) at most
# this many ms more.
SECRET_THROUGHPUT_FLOOR = 0.90
SECRET_ADDED_P50_MS = 0.3
SCAN_BYTES = 1024 * 1024  # the answer scanned for reflected values
SCAN_SECRETS = (1, 32)  # secrets loaded while scanning (32: placeholders.MAX_SECRETS)
TIMEOUT_S = 10.0
HEADERS = f"Host: {HOST}\r\nUser-Agent: corral-bench\r\nAccept: */*\r\n"
CONNECT = f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode()
DIRECT, BARE, CORRAL, SECRET = "direct", "bare mitmdump", "corral sidecar", "corral + secret"
SECRET_NAME = "BENCH_TOKEN"
SECRET_VALUE = "bench-" + secrets.token_hex(16)  # what the upstream must receive for the placeholder
ANCHORS = [  # the spec's figures for bare mitmdump 11.0.2 on this kind of machine (not measured here)
    ("added p50 per kept-alive request", "+3.7 ms"),
    ("per new intercepted TLS connection", "~24 ms"),
    ("requests/s of one proxy", "270-300"),
]
COMPILED = """\
What a compiled proxy (Envoy, or a Go proxy) would change: mitmproxy does every byte of TLS
interception, HTTP parsing and flow bookkeeping in Python on one event loop, so its Python core is the
ceiling for bare mitmdump and for Corral's sidecar alike; the ratio column is the addon's share on top
(policy, pinning, audit log). A compiled proxy terminates and re-originates TLS in C/Go with session
resumption and pooled upstream connections, with no interpreter work per request: the added latency
per kept-alive request would drop from milliseconds to well under one (tens of microseconds is
typical), a new intercepted connection would cost little more than the two handshakes' crypto (a few
ms: the leaf signature, the upstream handshake), and one proxy would use every core rather than one
event loop (thousands of requests/s rather than hundreds). These are expectations, not measured here.
Corral's policy, pinning and audit log would have to move with it (an ext_authz or Wasm filter, or Go
code); the audit record would then be the main per-request cost left."""


# The upstream. Like the tests' (tests/integration/upstream/server.py: any Host, /json answers JSON), but
# each response leaves in one write with TCP_NODELAY: http.server writes head and body apart, and Nagle
# plus the peer's delayed ACK then stalls every kept-alive response by 40 ms, which would swamp the
# proxies' own cost. No line per hit either: the bench counts requests in the sidecar's audit log.
UPSTREAM = r"""
import json, socket, ssl, sys, threading

def serve(conn, tls):
    buf = b""
    while True:
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
        lines, buf = buf[:end].split(b"\r\n"), buf[end + 4:]
        method, path, _ = lines[0].split(b" ", 2)
        host, length, auth = b"", 0, b""
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"host":
                host = value.strip().rsplit(b":", 1)[0] if value.count(b":") == 1 else value.strip()
            elif key == b"content-length":
                length = int(value)
            elif key == b"authorization":
                auth = value.strip()
        while len(buf) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
        body, buf = buf[:length], buf[length:]
        if auth and auth != b"Bearer " + VALUE:  # a placeholder not substituted, or another value
            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
            continue
        if path == b"/big":  # an answer to scan for reflected values: text, none of them in it
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(BIG), BIG))
            continue
        payload = json.dumps({"host": host.decode(), "method": method.decode(), "path": path.decode(),
                              "tls": tls, "bytes": len(body)}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                     b"set-cookie: upstream=secret-cookie\r\n\r\n%s" % (len(payload), payload))

def handle(conn, context):
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            conn = context.wrap_socket(conn, server_side=True)
        with conn:
            serve(conn, context is not None)
    except (OSError, ValueError):
        pass

def listen(port, context):
    server = socket.create_server(("0.0.0.0", port), backlog=512)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=handle, args=(conn, context), daemon=True).start()

VALUE = sys.argv[3].encode()
BIG = (b"<p>lorem ipsum dolor sit amet, consectetur adipiscing elit 0123456789</p>\n" * 20000)[:int(sys.argv[4])]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
threading.Thread(target=listen, args=(80, None), daemon=True).start()
threading.Thread(target=listen, args=(443, context), daemon=True).start()
print("READY", flush=True)
threading.Event().wait()
"""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the client sends its requests: straight to the upstream, or through a proxy."""

    name: str
    cafile: str  # what the client trusts: the test CA (direct) or the proxy's CA
    upstream: str  # the upstream's address (used when there is no proxy)
    proxy: tuple[str, int] | None = None
    headers: str = ""  # more request header lines, each ending in CRLF (a secret's placeholder)

    def get(self, path: str = "/json", *, tls: bool = True, extra: bool = True) -> bytes:
        """The GET to send: origin form in a tunnel (or direct), absolute form to a proxy over plain HTTP."""
        target = path if tls or self.proxy is None else f"http://{HOST}{path}"
        return f"GET {target} HTTP/1.1\r\n{HEADERS}{self.headers if extra else ''}\r\n".encode()


# -- the client (raw sockets: the same few microseconds for every target) ------------------------------

_contexts: dict[str, ssl.SSLContext] = {}


def _context(cafile: str) -> ssl.SSLContext:
    if cafile not in _contexts:
        _contexts[cafile] = ssl.create_default_context(cafile=cafile)
    return _contexts[cafile]


class Conn:
    """One HTTP/1.1 connection: send a request, read the whole response (Content-Length bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _head(self) -> tuple[int, bytes]:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            self.buf += chunk
        head, self.buf = self.buf[:end].lower(), self.buf[end + 4 :]
        return int(head[9:12]), head

    def exchange(self, request: bytes) -> int:
        self.sock.sendall(request)
        status, head = self._head()
        at = head.find(b"\r\ncontent-length:")
        length = int(head[at + 17 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        while len(self.buf) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the peer closed the connection mid-body")
            self.buf += chunk
        self.buf = self.buf[length:]
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        return status

    def close(self) -> None:
        self.sock.close()


def _tcp(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def open_https(target: Target) -> Conn:
    """TCP (to the proxy: CONNECT first), then TLS to allowed.test verified against the target's CA."""
    raw = _tcp(target.proxy or (target.upstream, 443))
    if target.proxy is not None:
        raw.sendall(CONNECT)
        tunnel = Conn(raw)
        status, _ = tunnel._head()
        if status != 200 or tunnel.buf:
            raise RuntimeError(f"CONNECT answered {status}")
    return Conn(_context(target.cafile).wrap_socket(raw, server_hostname=HOST))


def open_http(target: Target) -> tuple[Conn, bytes]:
    """A plain HTTP connection and the request to send on it (absolute-form through a proxy)."""
    return Conn(_tcp(target.proxy or (target.upstream, 80))), target.get(tls=False)


def probe(target: Target) -> None:
    """One HTTPS request on a new connection (readiness)."""
    conn = open_https(target)
    try:
        conn.exchange(target.get())
    finally:
        conn.close()


def kept_alive(
    targets: list[Target], tls: bool, warmup: int, samples: int, path: str = "/json"
) -> dict[str, list[float]]:
    """Milliseconds per request on one kept-alive connection per target, after ``warmup`` untimed ones.

    The targets take turns request by request (in an order that rotates), so a burst of load from
    elsewhere on the machine falls on all of them alike. ``path`` other than /json: a plain GET (no
    placeholder), for answers scanned for reflected values."""
    extra = path == "/json" and tls  # a secret goes only over HTTPS: plain HTTP carries none
    conns = {
        t.name: (open_https(t), t.get(path, extra=extra))
        if tls
        else (open_http(t)[0], t.get(path, tls=False, extra=extra))
        for t in targets
    }
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    clock = time.perf_counter
    try:
        for _ in range(warmup):
            for conn, request in conns.values():
                conn.exchange(request)
        for i in range(samples):
            for target in rotated(targets, i):
                conn, request = conns[target.name]
                start = clock()
                conn.exchange(request)
                out[target.name].append((clock() - start) * 1000)
    finally:
        for conn, _ in conns.values():
            conn.close()
    return out


def new_connections(targets: list[Target], samples: int) -> dict[str, list[float]]:
    """Milliseconds for a new connection each time: (CONNECT,) TLS handshake, one GET, close; in turns."""
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    for i in range(samples):
        for target in rotated(targets, i):
            start = time.perf_counter()
            conn = open_https(target)
            conn.exchange(target.get())
            conn.close()
            out[target.name].append((time.perf_counter() - start) * 1000)
    return out


def _load_worker(targets: list[Target], warmup: int, barrier: Barrier, pipe: Connection) -> None:
    """One client process: a kept-alive HTTPS connection to each target; told which one to load and for how
    long, it sends as many requests as it gets through, then reports how many."""
    sent = {t.name: 0 for t in targets}
    requests = {t.name: t.get() for t in targets}
    try:
        conns = {t.name: open_https(t) for t in targets}
        for name, conn in conns.items():
            for _ in range(warmup):
                conn.exchange(requests[name])
                sent[name] += 1
        pipe.send({"ready": True})
        while (order := pipe.recv()) is not None:
            name, seconds = order
            conn, request = conns[name], requests[name]
            barrier.wait(30)
            deadline = time.monotonic() + seconds
            done = 0
            while True:
                conn.exchange(request)
                sent[name] += 1
                if time.monotonic() > deadline:
                    break
                done += 1
            pipe.send({"done": done})
        for conn in conns.values():
            conn.close()
        pipe.send({"sent": sent})
    except BaseException as exc:
        barrier.abort()
        pipe.send({"error": f"{type(exc).__name__}: {exc}", "sent": sent})


class LoadPool:
    """Client processes (not threads: the client's GIL must not be the ceiling) that load one target at a
    time, so the targets can take turns second by second on connections that stay open."""

    def __init__(self, targets: list[Target], workers: int, warmup: int) -> None:
        mp = multiprocessing.get_context("fork")
        barrier = mp.Barrier(workers)
        self.pipes: list[Connection] = []
        self.procs = []
        for _ in range(workers):
            ours, theirs = mp.Pipe()
            self.pipes.append(ours)
            self.procs.append(mp.Process(target=_load_worker, args=(targets, warmup, barrier, theirs), daemon=True))
        for proc in self.procs:
            proc.start()
        self.sent: dict[str, int] = {t.name: 0 for t in targets}
        try:
            self._replies()
        except BaseException:
            for proc in self.procs:
                proc.kill()
                proc.join()
            raise

    def _replies(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        replies = []
        for pipe in self.pipes:
            if not pipe.poll(timeout_s):
                raise RuntimeError("a load worker did not answer")
            replies.append(pipe.recv())
        errors = [r["error"] for r in replies if "error" in r]
        if errors:
            raise RuntimeError(f"a load worker failed: {errors[0]}")
        return replies

    def run(self, target: Target, seconds: float) -> float:
        """Requests/s of all the workers at once on ``target``."""
        for pipe in self.pipes:
            pipe.send((target.name, seconds))
        return sum(int(r["done"]) for r in self._replies(30 + seconds)) / seconds

    def close(self) -> None:
        """Stop the workers; ``sent`` then holds how many requests each target got in all."""
        try:
            for pipe in self.pipes:
                pipe.send(None)
            for reply in self._replies():
                for name, count in reply["sent"].items():
                    self.sent[name] += count
        finally:
            for proc in self.procs:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()


# -- the world: upstream, bare mitmdump, Corral's sidecar ----------------------------------------------


def wait_for(what: str, probe: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            probe()
            return
        except (OSError, RuntimeError, ssl.SSLError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up: {exc}") from None
            time.sleep(0.2)


def start_upstream(runtime: DockerHarness, tag: str, network: str, directory: Path, labels: dict[str, str]) -> str:
    """The bench's upstream (HTTP :80, HTTPS :443 for any .test name, leaf from the tests' PKI)."""
    name = f"corral-bench-upstream-{tag}"
    (directory / "server.py").write_text(UPSTREAM)
    address = runtime.start_service(
        name,
        images.DESKTOP_IMAGE,
        [
            *("/opt/corral/bin/python", "/srv/server.py", "/srv/pki/leaf.pem", "/srv/pki/leaf.key"),
            SECRET_VALUE,
            str(SCAN_BYTES),
        ],
        network,
        UPSTREAM_NAMES,
        {str(directory): "/srv"},
        labels=labels,
    )
    deadline = time.monotonic() + 30
    while "READY" not in runtime.logs(name, 50):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the upstream did not come up:\n{runtime.logs(name, 50)}")
        time.sleep(0.1)
    return address


def bare_argv(state: Path) -> list[str]:
    """The sidecar's own mitmdump command line without the addon (``-s``) and its ``corral_*`` options."""
    argv = mitmdump_argv({"CORRAL_STATE_DIR": str(state)}, "0.0.0.0", "-")
    out = ["/opt/egress/bin/mitmdump"]
    rest = iter(argv[1:])
    for arg in rest:
        value = next(rest)
        if arg == "-s" or (arg == "--set" and value.startswith("corral_")):
            continue
        out += [arg, value]
    return out


def start_bare(runtime: DockerHarness, tag: str, network: str, state: Path, labels: dict[str, str]) -> str:
    """Bare mitmdump from the sidecar's image, with the sidecar's CPU and memory limits."""
    spec = ProxySpec("", SessionNetwork("", "", ""), state, network)  # only for its defaults
    return runtime.start_service(
        f"corral-bench-mitmdump-{tag}",
        spec.image,
        bare_argv(state),
        network,
        [],
        {},
        labels=labels,
        writable={str(state): str(state)},  # mitmproxy writes its dhparam file into the confdir
        cpus=spec.cpus,
        memory=spec.memory,
    )


def secrets_op(placeholders: list[str], loaded: int) -> PutSecrets:
    """The `secrets` control op (docs/secrets.md, as the gateway sends it): the first ``loaded`` of the
    bench's secrets, each bound to the upstream in headers. The first is the one the requests carry."""
    entries = tuple(
        SecretEntry(
            SECRET_NAME if i == 0 else f"{SECRET_NAME}_{i:02d}",
            placeholder,
            SECRET_VALUE if i == 0 else f"{SECRET_VALUE}-{i:02d}",
            (HOST,),
            ("header",),
        )
        for i, placeholder in enumerate(placeholders[:loaded])
    )
    return PutSecrets(entries, "api-key:bench")


def load_secrets(manager: EgressManager, egress: Egress, placeholders: list[str], loaded: int) -> None:
    reply = call_blocking(
        egress.proxy_address, manager.control_port, manager.token(egress.session_id), secrets_op(placeholders, loaded)
    )
    held = reply.secrets
    if held is None or not held.loaded or len(held.names) != loaded:
        raise RuntimeError(f"the sidecar did not take {loaded} secrets: {reply}")


def check_log(path: Path, sent: dict[str, int]) -> dict[str, Any]:
    """What a sidecar's audit log holds against what was sent through it: a record per request and
    CONNECT, one substitution per placeholder sent, no block; an intact chain; mitmproxy's version."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    events: dict[str, int] = {}
    for record in records:
        events[record["event"]] = events.get(record["event"], 0) + 1
    substituted = sum(
        int(r.get("count") or 0)
        for r in records
        if r["event"] == "secret" and r.get("rule") == "secret-substitution" and r.get("secret") == SECRET_NAME
    )
    chain_ok = audit.verify(path).ok
    return {
        "records": len(records),
        "events": events,
        "sent": sent,
        "substitutions": substituted,
        "chain_ok": chain_ok,
        "ok": chain_ok
        and events.get("request", 0) == sent["requests"]
        and events.get("connect", 0) == sent["connects"]
        and substituted == sent["placeholders"]
        and not events.get("block"),
        "version": next((str(r.get("version")) for r in records if r["event"] == "proxy"), "?"),
    }


def added_p50(values: list[float], baseline: list[float]) -> float:
    return round(pct(values, 50) - pct(baseline, 50), 3)


# -- statistics and the report ------------------------------------------------------------------------


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 50), 3), "p95_ms": round(pct(values, 95), 3), "n": len(values)}


def rotated(targets: list[Target], turn: int) -> list[Target]:
    """Turn i starts at target i mod n and reverses every other cycle: each target in each place evenly."""
    shift = turn % len(targets)
    order = targets[shift:] + targets[:shift]
    return order[::-1] if (turn // len(targets)) % 2 else order


def secret_report(
    stats: dict[str, Any], scans: dict[int, dict[str, list[float]]], budgets: list[dict[str, Any]]
) -> dict[str, Any]:
    """Print the brokered secret's figures against the plain sidecar; append its two gated budgets."""
    print(f"\nA brokered secret substituted on every request ({SECRET}) against none ({CORRAL})")
    print(f"  {'':<42}{'none':>10}{'secret':>10}{'added':>10}{'budget':>12}")
    https = {name: stats["https_keepalive"][name]["p50_ms"] for name in (CORRAL, SECRET)}
    added = round(https[SECRET] - https[CORRAL], 3)
    ok = added <= SECRET_ADDED_P50_MS
    print(
        f"  {'HTTPS request, kept-alive, p50 ms':<42}{https[CORRAL]:>10.2f}{https[SECRET]:>10.2f}{added:>+10.3f}"
        f"{'<= ' + str(SECRET_ADDED_P50_MS):>9}{'PASS' if ok else 'FAIL':>6}"
    )
    budgets.append(
        {
            "figure": "secret https_keepalive p50 added ms",
            "none": https[CORRAL],
            "secret": https[SECRET],
            "added": added,
            "budget": SECRET_ADDED_P50_MS,
            "ok": ok,
            "gated": True,
        }
    )
    for key, title in (("http_keepalive", "HTTP request, kept-alive"), ("new_tls_connection", "new TLS connection")):
        none_ms, secret_ms = (stats[key][name]["p50_ms"] for name in (CORRAL, SECRET))
        print(f"  {title + ', p50 ms':<42}{none_ms:>10.2f}{secret_ms:>10.2f}{secret_ms - none_ms:>+10.3f}{'*':>9}")
    best = {name: stats["requests_per_s"][name]["best"] for name in (CORRAL, SECRET)}
    ratio = best[SECRET] / best[CORRAL]
    ok = ratio >= SECRET_THROUGHPUT_FLOOR
    print(
        f"  {'requests/s of one proxy (best turn)':<42}{best[CORRAL]:>10.0f}{best[SECRET]:>10.0f}{ratio:>9.2f}x"
        f"{'>= ' + str(SECRET_THROUGHPUT_FLOOR):>9}{'PASS' if ok else 'FAIL':>6}"
    )
    budgets.append(
        {
            "figure": "secret requests_per_s",
            "none": best[CORRAL],
            "secret": best[SECRET],
            "ratio": round(ratio, 3),
            "budget": SECRET_THROUGHPUT_FLOOR,
            "ok": ok,
            "gated": True,
        }
    )
    median = {name: stats["requests_per_s"][name]["median"] for name in (CORRAL, SECRET)}
    print(
        f"  {'requests/s of one proxy (median turn)':<42}{median[CORRAL]:>10.0f}{median[SECRET]:>10.0f}"
        f"{median[SECRET] / median[CORRAL]:>9.2f}x"
    )
    print("  * not gated")
    print(f"\nScanning a {SCAN_BYTES // 1024} KiB answer for reflected values (kept-alive HTTPS, ms per answer)")
    print(f"  {'':<42}{'none p50':>10}{'secret p50':>12}{'added':>10}{'none p95':>10}{'secret p95':>12}")
    scan_out: dict[str, Any] = {}
    for loaded, series in scans.items():
        none_s, secret_s = summary(series[CORRAL]), summary(series[SECRET])
        extra = added_p50(series[SECRET], series[CORRAL])
        label = f"{loaded} secret{'s' if loaded > 1 else ''} loaded"
        print(
            f"  {label:<42}{none_s['p50_ms']:>10.2f}{secret_s['p50_ms']:>12.2f}{extra:>+10.2f}"
            f"{none_s['p95_ms']:>10.2f}{secret_s['p95_ms']:>12.2f}"
        )
        scan_out[str(loaded)] = {"none": none_s, "secret": secret_s, "added_p50_ms": extra}
    return {
        "https_keepalive_p50_added_ms": added,
        "requests_per_s_ratio_best": round(ratio, 3),
        "scan_1mb": scan_out,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the latency measurements")
    parser.add_argument("--requests", type=int, default=150, help="timed kept-alive requests per round")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests before each timed series")
    parser.add_argument("--connections", type=int, default=50, help="new TLS connections per round")
    parser.add_argument("--load-rounds", type=int, default=10, help="turns of each target at requests/s")
    parser.add_argument("--workers", type=int, default=4, help="client processes for requests/s")
    parser.add_argument("--seconds", type=float, default=1.5, help="duration of one turn at requests/s")
    parser.add_argument("--scan-requests", type=int, default=30, help="1 MB answers per sidecar and secret count")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still clean up when killed

    runtime = DockerHarness()
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    labels = {"corral.bench": tag}
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-egress-"))
    network = f"corral-bench-egress-{tag}"
    # What went through each sidecar, to check its audit log; "placeholders": requests carrying one.
    sent = {name: {"requests": 0, "connects": 0, "placeholders": 0} for name in (CORRAL, SECRET)}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, tmp, True)
        runtime.ensure_egress_network(network)
        cleanup.callback(runtime.remove_network, network)

        # The upstream.
        ca_path, _, _ = write_test_pki(tmp / "upstream" / "pki")
        cleanup.callback(runtime.remove, f"corral-bench-upstream-{tag}")
        upstream = start_upstream(runtime, tag, network, tmp / "upstream", labels)

        # Corral's sidecar, provisioned the way the gateway does it.
        settings = GatewaySettings(
            data_dir=tmp / "data",
            instance=f"bench-{tag}",
            egress_network=network,
            egress_trusted_networks=f"{upstream}/32",
            egress_upstream_ca=ca_path,
        )
        manager = EgressManager(settings, runtime)
        asyncio.run(manager.start())
        session = f"ses_bench{secrets.token_hex(6)}"
        prepared = manager.prepare_blocking(session, [HOST], "enforce", {"corral.gateway": settings.instance, **labels})
        cleanup.callback(manager.discard_blocking, prepared)
        egress: Egress = manager.start_proxy_blocking(prepared)
        cleanup.callback(manager.teardown_blocking, egress)
        asyncio.run(manager.wait_ready(egress, 60))
        # A second one, the same but for the brokered secret it holds.
        secret_session = f"ses_bench{secrets.token_hex(6)}"
        prepared_secret = manager.prepare_blocking(
            secret_session, [HOST], "enforce", {"corral.gateway": settings.instance, **labels}
        )
        cleanup.callback(manager.discard_blocking, prepared_secret)
        secret_egress: Egress = manager.start_proxy_blocking(prepared_secret)
        cleanup.callback(manager.teardown_blocking, secret_egress)
        asyncio.run(manager.wait_ready(secret_egress, 60))
        placeholders = [new_placeholder() for _ in range(max(SCAN_SECRETS))]
        load_secrets(manager, secret_egress, placeholders, 1)

        # Bare mitmdump: the same image and options, its own CA, on the upstream's network.
        bare_state = tmp / "bare"
        ca.create(bare_state / "ca", "ses_bench")
        shutil.copyfile(ca_path, bare_state / "upstream-ca.pem")
        for path in (bare_state, bare_state / "ca"):
            path.chmod(0o755)
        cleanup.callback(runtime.remove, f"corral-bench-mitmdump-{tag}")
        bare_ip = start_bare(runtime, tag, network, bare_state, labels)

        direct = Target(DIRECT, str(ca_path), upstream)
        bare = Target(BARE, str(bare_state / "ca" / ca.CERT_ONLY), upstream, (bare_ip, PROXY_PORT))
        corral = Target(
            CORRAL, str(Path(egress.state_dir) / "ca" / ca.CERT_ONLY), upstream, (egress.proxy_address, PROXY_PORT)
        )
        secret = Target(
            SECRET,
            str(Path(secret_egress.state_dir) / "ca" / ca.CERT_ONLY),
            upstream,
            (secret_egress.proxy_address, PROXY_PORT),
            f"Authorization: Bearer {placeholders[0]}\r\n",
        )
        targets = [direct, bare, corral, secret]
        sidecars = {CORRAL: egress, SECRET: secret_egress}
        for target in targets:
            wait_for(target.name, functools.partial(probe, target))

        def count(target: Target, requests: int, connects: int, placeholders: bool = True) -> None:
            if target.name in sent:
                sent[target.name]["requests"] += requests
                sent[target.name]["connects"] += connects
                sent[target.name]["placeholders"] += requests if placeholders and target.headers else 0

        for target in (corral, secret):
            count(target, 1, 1)  # the probe

        started = time.monotonic()
        https: dict[str, list[float]] = {t.name: [] for t in targets}
        plain: dict[str, list[float]] = {t.name: [] for t in targets}
        fresh: dict[str, list[float]] = {t.name: [] for t in targets}
        rates: dict[str, list[float]] = {t.name: [] for t in targets}
        per_series = args.warmup + args.requests
        for _ in range(args.rounds):
            for name, values in kept_alive(targets, True, args.warmup, args.requests).items():
                https[name] += values
            for target in (corral, secret):
                count(target, per_series, 1)
            for name, values in kept_alive(targets, False, args.warmup, args.requests).items():
                plain[name] += values
            for target in (corral, secret):
                count(target, per_series, 0, placeholders=False)
            for name, values in new_connections(targets, args.connections).items():
                fresh[name] += values
            for target in (corral, secret):
                count(target, args.connections, args.connections)
        pool = LoadPool(targets, args.workers, args.warmup)
        try:
            for turn in range(args.load_rounds):
                for target in rotated(targets, turn):
                    rates[target.name].append(pool.run(target, args.seconds))
        finally:
            pool.close()
        for target in (corral, secret):
            count(target, pool.sent[target.name], args.workers)
        # Scanning answers for reflected values: a 1 MB answer through both sidecars, turn by turn, with
        # 1 secret loaded and then 32 (the plain sidecar, holding none, is the baseline of each phase).
        scans: dict[int, dict[str, list[float]]] = {}
        scan_warmup = 3
        for loaded in SCAN_SECRETS:
            load_secrets(manager, secret_egress, placeholders, loaded)
            scans[loaded] = kept_alive([corral, secret], True, scan_warmup, args.scan_requests, "/big")
            for target in (corral, secret):
                count(target, scan_warmup + args.scan_requests, 1, placeholders=False)
        elapsed = time.monotonic() - started
        load_after = os.getloadavg()[0]

        # The sidecars must really have logged every request (the measured path is the audit path), and
        # the one with the secret every substitution (one secret record per request, location header).
        logs = {name: check_log(sidecar.audit_path, sent[name]) for name, sidecar in sidecars.items()}
        version = str(logs[CORRAL]["version"])
        # And kept every answer for hermetic replays (the proxy flushes its queue when it stops).
        runtime.stop(egress.proxy_id)  # behind the manager's back: its teardown comes at the end
        responses = manager.responses_path(session)
        kept = check(responses.read_bytes()) if responses.exists() else FlowFile(0, 0, False)
        audit_ok = all(log["ok"] for log in logs.values())

    # -- report ---------------------------------------------------------------------------------------
    stats = {
        "https_keepalive": {name: summary(v) for name, v in https.items()},
        "http_keepalive": {name: summary(v) for name, v in plain.items()},
        "new_tls_connection": {name: summary(v) for name, v in fresh.items()},
        "requests_per_s": {
            name: {
                "best": round(max(v), 1),
                "median": round(statistics.median(v), 1),
                "turns": [round(x, 1) for x in v],
            }
            for name, v in rates.items()
        },
    }
    titles = {
        "https_keepalive": "HTTPS request, kept-alive connection",
        "http_keepalive": "HTTP request, kept-alive connection",
        "new_tls_connection": "new TLS-intercepted connection + 1 GET",
    }
    gated = {"https_keepalive", "new_tls_connection"}  # the spec's figures; plain HTTP is shown for information
    budgets: list[dict[str, Any]] = []
    print(f"Egress proxy benchmark: mitmdump {version} (corral-egress image), upstream on a Docker bridge")
    print(
        f"({args.rounds} rounds x {args.requests} kept-alive requests, {args.rounds} x {args.connections} new "
        f"connections, {args.load_rounds} x {args.seconds:g} s of {args.workers} client processes; "
        f"{elapsed:.0f} s; load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores)\n"
    )
    head = f"{'':<44}{'direct':>10}{'bare':>10}{'corral':>10}{'corral/bare':>13}{'budget':>9}"
    print(head)
    for key, title in titles.items():
        for q in ("p50_ms", "p95_ms"):
            d, b, c = (stats[key][name][q] for name in (DIRECT, BARE, CORRAL))
            ratio = c / b
            ok = ratio <= BUDGET
            verdict = ("PASS" if ok else "FAIL") if key in gated else ("ok" if ok else "over") + "*"
            label = f"{title}, {q[:3]} ms"
            print(f"  {label:<42}{d:>10.2f}{b:>10.2f}{c:>10.2f}{ratio:>12.2f}x{verdict:>9}")
            budgets.append(
                {
                    "figure": f"{key} {q[:3]}",
                    "bare": b,
                    "corral": c,
                    "ratio": round(ratio, 3),
                    "budget": BUDGET,
                    "ok": ok,
                    "gated": key in gated,
                }
            )
    # The ceiling is the best turn: load from elsewhere on the machine only ever takes CPU away from a
    # proxy (capped at one core), so the slower turns measure the neighbours; the median is shown too.
    d, b, c = (stats["requests_per_s"][name]["best"] for name in (DIRECT, BARE, CORRAL))
    ratio = c / b
    ok = ratio >= THROUGHPUT_FLOOR
    print(
        f"  {'requests/s of one proxy (best turn)':<42}{d:>10.0f}{b:>10.0f}{c:>10.0f}{ratio:>12.2f}x"
        f"{'PASS' if ok else 'FAIL':>9}"
    )
    md, mb, mc = (stats["requests_per_s"][name]["median"] for name in (DIRECT, BARE, CORRAL))
    print(f"  {'requests/s of one proxy (median turn)':<42}{md:>10.0f}{mb:>10.0f}{mc:>10.0f}{mc / mb:>12.2f}x")
    budgets.append(
        {
            "figure": "requests_per_s",
            "bare": b,
            "corral": c,
            "ratio": round(ratio, 3),
            "budget": THROUGHPUT_FLOOR,
            "ok": ok,
            "gated": True,
        }
    )
    print(
        f"  budget: corral/bare <= {BUDGET} for latencies, >= {THROUGHPUT_FLOOR} for requests/s (best turn; the"
        " sidecar also keeps every response); * not gated (plain HTTP)"
    )
    for name in (BARE, CORRAL):
        print(f"  {name} requests/s turns: {', '.join(f'{x:.0f}' for x in stats['requests_per_s'][name]['turns'])}")

    added = {
        name: {
            key: round(stats[key][name]["p50_ms"] - stats[key][DIRECT]["p50_ms"], 3)
            for key in ("https_keepalive", "http_keepalive", "new_tls_connection")
        }
        for name in (BARE, CORRAL)
    }
    print("\nAdded latency over direct (p50 ms)")
    print(f"  {'':<42}{'bare':>10}{'corral':>10}")
    for key, title in titles.items():
        print(f"  {title:<42}{added[BARE][key]:>+10.2f}{added[CORRAL][key]:>+10.2f}")
    print("\nThe spec's figures for bare mitmdump 11.0.2 (not measured here)")
    for name, value in ANCHORS:
        print(f"  {name:<42}{value:>10}")
    secret_figures = secret_report(stats, scans, budgets)
    for name, log in logs.items():
        events = log["events"]
        print(
            f"\n{name} audit log: {log['records']} records, chain {'intact' if log['chain_ok'] else 'BROKEN'}; "
            f"{events.get('request', 0)} request records for {log['sent']['requests']} requests sent, "
            f"{events.get('connect', 0)} connect records for {log['sent']['connects']} CONNECTs, "
            f"{log['substitutions']} substitutions for {log['sent']['placeholders']} placeholders sent, "
            f"{events.get('block', 0)} blocks {'(all logged)' if log['ok'] else '(MISMATCH)'}"
        )
    print(f"Recorded responses (responses.mitm, kept for hermetic replays): {kept.flows} flows, {kept.complete} bytes")
    print()
    print(COMPILED)

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "egress.json").write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "mitmproxy": version,
                "params": vars(args),
                "load_average": {"before": load_before, "after": load_after, "cores": os.cpu_count()},
                "results": stats,
                "added_p50_ms_over_direct": added,
                "budgets": budgets,
                "secrets": secret_figures,
                "audit": {**logs[CORRAL], "ok": audit_ok, "by_sidecar": logs},
                "responses_kept": {"flows": kept.flows, "bytes": kept.complete},
                "compiled_proxy": " ".join(COMPILED.split()),
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS / 'egress.json'}")
    return 0 if audit_ok and all(b["ok"] for b in budgets if b["gated"]) else 1


if __name__ == "__main__":
    sys.exit(main())
