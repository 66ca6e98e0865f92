"""Every audit record and every audit log bounded, and reading them streamed: played for real.

A page served by the fake upstream makes requests as large as a browser sends (a 1 MB URL, a 60 kB
header value, 3000 headers) and floods its session with requests past a small budget, through a
real egress proxy; the gateway then streams a 200 MB log while its memory stays flat. All traffic
stays on this machine (the test's own Docker networks, names under .test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.proxy.audit import AuditLog
from corral.sdk import Sandbox

from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

BUDGET = 256 << 10  # the test gateway's CORRAL_AUDIT_MAX_BYTES: small, so a page passes it quickly
FLOOD = 600  # requests of the flooding page: well past the budget (a browser's request record is ~1-2 kB)
# The proxy keeps writing its session's own changes and its counts a little past the budget (the
# reserve of corral.proxy.audit.LogBudget: an eighth of it, at least 32 KiB), then one final count.
RESERVE = max(BUDGET // 8, 32 << 10)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-audit-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"audit-{os.getpid()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("audit-gw"), instance, audit_max_bytes=BUDGET) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def _title(sb: Sandbox, prefix: str, timeout_s: float) -> str:
    def current() -> str:
        title = str(sb.page_info().title)
        return title if title.startswith(prefix) else ""

    return str(wait_for(current, timeout_s) or sb.page_info().title)


def _raw_log(gw: RunningGateway, session_id: str) -> bytes:
    with gw.client() as c:
        response = c.get(f"/v1/sessions/{session_id}/traffic")
    assert response.status_code == 200, response.text
    return response.content


def _cli_verify(gw: RunningGateway, session_id: str) -> subprocess.CompletedProcess[str]:
    """`corral audit verify <session>` against the gateway: the log and the gateway's anchors."""
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "audit", "verify", session_id, "--json"],
        env={**os.environ, "CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_page_s_huge_requests_make_capped_marked_records_and_the_chain_verifies(gw: RunningGateway) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.navigate("https://allowed.test/page/audit-huge.html")
        assert _title(sb, "audit-huge done", 60).startswith("audit-huge done"), sb.page_info()
        session_id = sb.id
    raw = _raw_log(gw, session_id)
    lines = raw.splitlines()
    records = [json.loads(line) for line in lines]
    longest = max(len(line) for line in lines)
    assert longest < 128 << 10, f"a record of {longest} bytes: not capped"
    exchanges = [r for r in records if r["event"] in ("request", "block", "error") and r.get("url")]
    long_url = next(r for r in exchanges if "long=" in r["url"])
    assert "url" in long_url["truncated"] and long_url["url"].endswith("…") and len(long_url["url"]) <= 4096
    huge = next(r for r in exchanges if "huge-header=1" in r["url"])
    assert huge["event"] == "request", huge
    value = dict(huge["request_headers"])["x-huge"]
    assert value.endswith("…") and len(value) <= 512 and "request_headers" in huge["truncated"]
    many = next(r for r in exchanges if "many-headers=1" in r["url"])
    assert many["event"] == "request", many
    headers = many["request_headers"]
    assert len(headers) == 65 and headers[-1][0] == "…" and headers[-1][1].endswith("more headers"), headers[-3:]
    assert int(headers[-1][1].split()[0]) + 64 >= 3000  # the count of what was cut is kept
    assert "request_headers" in many["truncated"]
    assert isinstance(many["bytes_out"], int) and isinstance(many["status"], int)  # numbers stay numbers
    done = _cli_verify(gw, session_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == "intact"


def test_a_flood_past_the_budget_leaves_a_marker_and_counts_and_the_log_stops_growing(
    gw: RunningGateway, upstream: Upstream, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.navigate(f"https://allowed.test/page/audit-flood.html?n={FLOOD}")
        assert _title(sb, "audit-flood done", 180) == f"audit-flood done {FLOOD}", sb.page_info()
        session_id = sb.id
    raw = _raw_log(gw, session_id)
    records = [json.loads(line) for line in raw.splitlines()]
    tally = [r for r in records if r["event"] == "tally"]
    markers = [r for r in records if r["event"] == "budget"]
    final = tally[-1] if tally else {}
    assert len(raw) <= BUDGET + RESERVE + (32 << 10), (
        f"{len(raw)} bytes for a budget of {BUDGET}: {len(markers)} markers, {len(tally)} tallies"
    )
    assert len(markers) == 1 and markers[0]["max_bytes"] == BUDGET
    marker_at = markers[0]["seq"]
    assert not [r for r in records if r["seq"] > marker_at and r["event"] == "request"]  # counts only after it
    written = sum(1 for r in records if r["event"] == "request" and "flood=" in str(r.get("url")))
    counted = {(row["host"], row["event"], row["decision"]): row["count"] for row in final["counts"]}
    assert final["dropped"] == sum(counted.values())
    sent = sum(1 for hit in upstream.hits(runtime) if "flood=" in str(hit["path"]))
    assert sent >= FLOOD
    # Every request the upstream saw is in the log: written whole, or counted (a favicon may add one).
    assert FLOOD <= written + counted.get(("allowed.test", "request", "allow"), 0) <= FLOOD + 3, (written, counted)
    assert counted.get(("other.test", "connect", "deny"), 0) >= 1  # refusals are counted too
    print(f"\nflood: {len(raw)} bytes for a budget of {BUDGET}: {written} written, {final['dropped']} counted")
    done = _cli_verify(gw, session_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == "intact"
    with gw.client() as c:
        summary = c.get(f"/v1/sessions/{session_id}/traffic", params={"event": "tally"}).text
    assert summary.count("\n") == len(tally)  # the counts are records like any other: filtered, streamed


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class _PeakRss:
    """The process's highest resident memory while the block runs, sampled every 20 ms."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            self._stop.wait(0.02)

    def __enter__(self) -> _PeakRss:
        self.peak = _rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _fill(log_path: Path, session_id: str, size: int) -> int:
    """The session's log grown to ``size`` bytes through the proxy's own writer (no budget): records
    like a browser's requests, each about 4 kB."""
    log = AuditLog(log_path, session_id)
    headers = [(f"x-header-{i}", "v" * 150) for i in range(20)]
    n = 0
    while log_path.stat().st_size < size:
        for _ in range(1000):
            n += 1
            log.write(
                "request",
                id=f"flow-{n}",
                started=time.time(),
                method="GET",
                url=f"https://allowed.test/filler/{n}",
                host="allowed.test",
                port=443,
                status=200,
                request_headers=headers,
                response_headers=headers,
                bytes_in=n,
                bytes_out=0,
                decision="allow",
            )
    log.close()
    return n


def _streamed_growth(gw: RunningGateway, path: str, target: Path) -> tuple[float, int]:
    """The process's memory growth (MB) while the gateway (in this process) answers ``path`` and the
    client streams the answer to ``target``; and the bytes received."""
    received = 0
    with gw.client() as c, _PeakRss() as peak, target.open("wb") as out:
        base = _rss_mb()
        with c.stream("GET", path) as response:
            assert response.status_code == 200
            for chunk in response.iter_bytes(1 << 20):
                received += out.write(chunk)
    return peak.peak - base, received


def test_the_gateway_streams_a_200_mb_log_with_flat_memory(gw: RunningGateway, tmp_path: Path) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        session_id = sb.id
    log_path = Path(gw.settings.data_dir) / "egress" / session_id / "audit.jsonl"
    records = _fill(log_path, session_id, 200 << 20)
    size = log_path.stat().st_size
    growth, received = _streamed_growth(gw, f"/v1/sessions/{session_id}/traffic", tmp_path / "log.jsonl")
    print(f"\n/traffic: {size >> 20} MB log ({records} records), process memory grew {growth:.1f} MB while streaming")
    assert received == size
    assert growth < 64, f"{growth:.0f} MB more memory to stream a {size >> 20} MB log"
    har_growth, har_bytes = _streamed_growth(
        gw, f"/v1/sessions/{session_id}/traffic.har?host=allowed.test", tmp_path / "log.har"
    )
    print(f"/traffic.har: {har_bytes >> 20} MB of HAR, process memory grew {har_growth:.1f} MB")
    assert har_growth < 64, f"{har_growth:.0f} MB more memory to write HAR of a {size >> 20} MB log"
    with (tmp_path / "log.har").open("rb") as har:
        har.seek(-3, os.SEEK_END)
        assert har.read() == b"]}}"  # written whole (json.loads of all of it is the unit tests')
    with gw.client() as c, _PeakRss() as peak:
        base = _rss_mb()
        listed: list[dict[str, Any]] = c.get("/v1/audit").json()
    mine = next(item for item in listed if item["session"] == session_id)
    assert mine["bytes"] == size and mine["records"] >= records
    assert peak.peak - base < 64
    done = _cli_verify(gw, session_id)  # the CLI streams it to a file and verifies it, line by line
    assert done.returncode == 0, done.stdout + done.stderr
