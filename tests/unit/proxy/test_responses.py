"""The recorded responses' store (corral.proxy.responses): flows appended within byte budgets, read
back by mitmproxy's own reader, resumed after a torn write. Recording and replaying through the
addons: tests/unit/proxy/addons/test_recorder.py and test_playback.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy.test import tflow, tutils

from corral.proxy.flowfile import check
from corral.proxy.responses import RESPONSES_FILE, ResponseStore

from .addons.harness import answered, read_flows


def test_a_restarted_proxy_carries_on_after_a_torn_flow(tmp_path: Path) -> None:
    path = tmp_path / RESPONSES_FILE
    first = ResponseStore(path, max_body=100, max_total=1000)
    first.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"one"), "allowed.test")
    first.close()
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:20])  # killed mid-write
    again = ResponseStore(path, max_body=100, max_total=100_000)  # resumed bytes count against the total
    again.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"two"), "allowed.test")
    again.close()
    assert [f.response.content for f in read_flows(path)] == [b"one", b"two"]
    assert again.counts()["bytes"] == len(whole) + 3
    path.write_bytes(b"garbage")
    ResponseStore(path, max_body=100, max_total=1000).close()  # unreadable: kept aside, a fresh start
    assert path.read_bytes() == b"" and len(list(tmp_path.glob("responses.unreadable-*"))) == 1


async def test_a_quiet_session_s_last_flows_reach_the_file_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    timers: list[tuple[float, Callable[[], object]]] = []
    schedule = loop.call_later

    def later(delay: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        timers.append((delay, callback))  # fired below, by hand: the test's clock
        return schedule(3600, callback)

    monkeypatch.setattr(loop, "call_later", later)
    path = tmp_path / RESPONSES_FILE
    store = ResponseStore(path, max_body=100, max_total=1000)
    store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"one"), "allowed.test")
    store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"two"), "allowed.test")
    assert path.read_bytes() == b""  # buffered: a flow costs no write of its own
    ((delay, flush),) = timers  # one timer for the buffer, however many flows wait in it
    assert delay <= 1.0
    flush()  # nothing else comes: the buffer is flushed by the timer
    assert check(path.read_bytes()).flows == 2
    store.close()


def test_the_byte_budgets_skip_and_count(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / RESPONSES_FILE, max_body=10, max_total=12)
    for body in (b"12345678", b"too long body", b"1234567", b"x"):  # kept, too big, over the total, kept
        store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), body), "allowed.test")
    store.close()
    assert store.counts() == {"kept": 2, "skipped": 2, "bytes": 9}
    assert [f.response.content for f in read_flows(tmp_path / RESPONSES_FILE)] == [b"12345678", b"x"]
