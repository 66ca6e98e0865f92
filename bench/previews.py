"""Port previews: what the preview path adds (docs/previews.md), against two baselines.

    flock /tmp/corral-bench.lock .venv/bin/python bench/previews.py [--requests 300] [--mb 200]

The server is tests/integration/preview_server.py (standard library, threaded), run three ways:
  * through the preview: in the sandbox as the agent on 127.0.0.1:3000, fetched from the host with
    httpx through the gateway's preview listener (header secret, one kept-alive connection);
  * host direct: the same script on the host's loopback, fetched with the same httpx client: the
    client's and server's own cost, without the gateway, the tunnel and the container network;
  * in-sandbox direct: the same server in the sandbox fetched from inside by a Python http.client
    loop run with exec (another client, so read its numbers as the server's floor, not as the same
    measurement). The host cannot reach the container's address (the host guard), so no baseline
    can be the very same client to the very same server without the preview;
  * the in-sandbox door (corral.sandbox.previewdoor), as the sandbox's own browser reaches a preview:
    GETs each on a new connection, straight to the server and through the door on 127.0.0.1:8701
    (its Host), alternated in one exec, and one large download each way.

Measured: a small GET's round trip (median and p90 over ``--requests``, after 20 warm-ups), a new
connection's first GET (the tunnel's WebSocket handshake to the controller included), a large
download and upload (``--mb`` MiB) in MB/s. Four runs here (2 cores shared with four other helpers'
builds and tests; ranges in docs/previews.md#measured): GET median 1.4-7.2 ms through the preview
against 0.5-1.2 ms host direct; a new connection 13-58 ms against 3.3-5.2 ms; down 66-126 MB/s
(the in-sandbox server alone: 26-106 MB/s), up 24-152 MB/s.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from corral.gateway.server import running
from corral.gateway.settings import GatewaySettings

KEY = "bench-key-Vq7Lm3Tz9Wr5Xc2Nb8Kh4Jd6Pf"
SERVER = Path(__file__).resolve().parent.parent / "tests" / "integration" / "preview_server.py"
PORT = 3000

INSIDE = """
import http.client, statistics, sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", 3000)
def get(path):
    c.request("GET", path); r = c.getresponse(); return r.read()
for _ in range(20): get("/")
times = []
for _ in range(n):
    t = time.perf_counter(); get("/"); times.append(time.perf_counter() - t)
t = time.perf_counter(); body = get(f"/big?n={size}"); big = time.perf_counter() - t
assert len(body) == size
block = b"u" * (1 << 20)
t = time.perf_counter()
c.putrequest("POST", "/echo"); c.putheader("content-length", str(size)); c.endheaders()
for _ in range(size >> 20): c.send(block)
r = c.getresponse(); r.read(); up = time.perf_counter() - t
times.sort()
print(statistics.median(times) * 1000, times[int(len(times) * 0.9)] * 1000, size / big / 1e6, size / up / 1e6)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rtts(get: Callable[[], None], n: int) -> tuple[float, float]:
    for _ in range(20):
        get()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        get()
        times.append(time.perf_counter() - started)
    times.sort()
    return statistics.median(times) * 1000, times[int(len(times) * 0.9)] * 1000


def download(client: httpx.Client, size: int) -> float:
    started = time.perf_counter()
    got = 0
    with client.stream("GET", "/big", params={"n": str(size)}) as answer:
        for chunk in answer.iter_bytes():
            got += len(chunk)
    assert got == size, got
    return size / (time.perf_counter() - started) / 1e6


def upload(client: httpx.Client, size: int) -> float:
    block = b"u" * (1 << 20)

    def body() -> Iterator[bytes]:
        for _ in range(size >> 20):
            yield block

    started = time.perf_counter()
    answer = client.post("/echo", content=body())
    assert answer.json()["size"] == size, answer.text
    return size / (time.perf_counter() - started) / 1e6


def fresh_connections(make: Callable[[], httpx.Client], n: int) -> float:
    times = []
    for _ in range(n):
        with make() as client:
            started = time.perf_counter()
            client.get("/").raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(name: str, make: Callable[[], httpx.Client], n: int, size: int) -> None:
    with make() as client:
        median, p90 = rtts(lambda: client.get("/").raise_for_status() and None, n)
        down = download(client, size)
        up = upload(client, size)
    first = fresh_connections(make, 30)
    print(
        f"{name:<22} GET median {median:6.2f} ms  p90 {p90:6.2f} ms  new connection {first:6.2f} ms"
        f"  down {down:7.1f} MB/s  up {up:7.1f} MB/s"
    )


# Run by the agent: GETs each on a new connection, straight to the server and through the door (its
# Host), alternated, then one large download each way: ms per request (median, p95) and MB/s.
DOOR = """
import http.client, json, statistics, sys, time
host, port, n, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def once(target, path, headers):
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", target, timeout=30)
    conn.request("GET", path, headers=headers)
    body = conn.getresponse().read()
    conn.close()
    return time.perf_counter() - started, len(body)
ways = (("direct", port, {}), ("door", 8701, {"Host": host}))
times = {name: [] for name, _, _ in ways}
for _ in range(n):
    for name, target, headers in ways:
        times[name].append(once(target, "/", headers)[0] * 1000)
out = {}
for name, target, headers in ways:
    seconds, size = once(target, f"/big?n={big}", headers)
    assert size == big
    ordered = sorted(times[name])
    out[name] = {"median_ms": statistics.median(ordered), "p95_ms": ordered[int(n * 0.95)], "mb_s": big / seconds / 1e6}
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    size = args.mb << 20
    with tempfile.TemporaryDirectory(prefix="corral-bench-previews-") as data:
        settings = GatewaySettings(
            port=free_port(),
            preview_port=free_port(),
            preview_max_body_mb=args.mb + 1,
            data_dir=Path(data),
            api_key=KEY,
            instance=f"bench-previews-{time.time_ns()}",
            pool_size=0,
            record=False,
            network="corral-bench-previews",
            egress_network="corral-bench-previews-egress",
        )
        host_port = free_port()
        host_server = subprocess.Popen([sys.executable, str(SERVER), str(host_port)])
        try:
            with (
                running(settings),
                httpx.Client(
                    base_url=f"http://127.0.0.1:{settings.port}",
                    headers={"Authorization": f"Bearer {KEY}"},
                    timeout=300,
                ) as api,
            ):
                session = api.post("/v1/sessions", json={}).raise_for_status().json()
                try:
                    run(api, session["id"], settings, host_port, args.requests, size)
                finally:
                    api.delete(f"/v1/sessions/{session['id']}")
        finally:
            host_server.terminate()
            host_server.wait()


def run(api: httpx.Client, session_id: str, settings: GatewaySettings, host_port: int, n: int, size: int) -> None:
    files = f"/v1/sessions/{session_id}/files"
    api.put(
        files, params={"path": "/tmp/preview_server.py"}, content=SERVER.read_bytes(),
        headers={"content-type": "application/octet-stream"},
    ).raise_for_status()  # fmt: skip
    actions = f"/v1/sessions/{session_id}/actions"
    argv = ["python3", "/tmp/preview_server.py", str(PORT)]
    api.post(actions, json={"action": {"type": "exec", "argv": argv, "background": True}}).raise_for_status()
    time.sleep(1.0)
    preview = api.post(f"/v1/sessions/{session_id}/previews", json={"port": PORT}).raise_for_status().json()
    secret = preview["url"].split("corral_preview_token=", 1)[1]

    def through_preview() -> httpx.Client:
        return httpx.Client(
            base_url=f"http://127.0.0.1:{settings.preview_port}",
            headers={"host": f"{preview['host']}:{settings.preview_port}", "x-corral-preview-token": secret},
            timeout=300,
        )

    def host_direct() -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{host_port}", timeout=300)

    measure("through the preview", through_preview, n, size)
    measure("host direct", host_direct, n, size)
    inside = api.post(
        actions, json={"action": {"type": "exec", "argv": ["python3", "-c", INSIDE, str(n), str(size)]}}
    ).json()
    median, p90, down, up = (float(v) for v in inside["result"]["stdout"].split())
    print(
        f"{'in-sandbox direct':<22} GET median {median:6.2f} ms  p90 {p90:6.2f} ms  (http.client)"
        f"{'':>24}down {down:7.1f} MB/s  up {up:7.1f} MB/s"
    )
    door_host = f"{PORT}-{session_id.removeprefix('ses_')}.localhost:8701"
    argv = ["python3", "-c", DOOR, door_host, str(PORT), str(min(n, 200)), str(min(size, 64 << 20))]
    door = api.post(actions, json={"action": {"type": "exec", "argv": argv, "timeout_ms": 300_000}}).json()
    numbers = json.loads(door["result"]["stdout"])
    for name in ("direct", "door"):
        got = numbers[name]
        print(
            f"{'in-sandbox ' + name:<22} GET median {got['median_ms']:6.2f} ms  p95 {got['p95_ms']:6.2f} ms"
            f"  (new connection each){'':>6}down {got['mb_s']:7.1f} MB/s"
        )


if __name__ == "__main__":
    main()
