"""Recorded responses and hermetic replay, through the egress addon and mitmproxy's own test doubles.

A session records: its flow file is read back by mitmproxy's reader and served by a hermetic
session, whose policy still decides first, which never resolves or dials, and which refuses what
the recording does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http, io
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.serverplayback import ServerPlayback
from mitmproxy.proxy import server_hooks
from mitmproxy.test import taddons, tflow, tutils

from corral.proxy import control
from corral.proxy.addon import Egress
from corral.proxy.flowfile import FlowFile, check
from corral.proxy.responses import BLANKED, REPLAY_FILE, RESPONSES_FILE, ResponseStore

from .test_addon import Lookups, connect_flow, plain_request, records, tunnel_request

OPTIONS = {
    "corral_session": "ses_test",
    "corral_trusted_networks": "203.0.113.0/24",
    "corral_own_hosts": "corral-proxy",
}


def _policy(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "policy.json").write_text(json.dumps({"allow": ["allowed.test", "*.allowed.test"], "mode": "enforce"}))


def answered(flow: http.HTTPFlow, body: bytes, status: int = 200, **headers: str) -> http.HTTPFlow:
    flow.response = tutils.tresp(status_code=status, content=body, headers=http.Headers(**headers))
    return flow


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[tuple[Egress, Lookups, Path]]:
    addon = Egress()
    addon.lookup = lookups = Lookups()
    state = tmp_path / "recorded"
    _policy(state)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, corral_state_dir=str(state), corral_keep_responses=True, **OPTIONS)
        yield addon, lookups, state
        addon.responses.close()  # type: ignore[union-attr]


async def record_visit(addon: Egress, path: str, body: bytes) -> http.HTTPFlow:
    connect = connect_flow("api.allowed.test")
    await addon.http_connect(connect)
    flow = tunnel_request(connect, "api.allowed.test", path)
    flow.request.headers["cookie"] = "session=abc"
    flow.request.headers["x-goog-api-key"] = "AIza-secret"
    await addon.requestheaders(flow)
    flow.request.data.host = "203.0.113.11"  # mitmproxy names a tunnel's request by the pinned address
    addon.response(answered(flow, body, **{"content-type": "text/html", "set-cookie": "id=1"}))
    return flow


def read_flows(path: Path) -> list[http.HTTPFlow]:
    with path.open("rb") as stream:
        return [f for f in io.FlowReader(stream).stream() if isinstance(f, http.HTTPFlow)]


async def test_allowed_answers_are_kept_by_name_with_request_credentials_blanked(recording) -> None:
    addon, _, state = recording
    await record_visit(addon, "/page", b"<p>one</p>")
    blocked = plain_request("blocked.test")
    await addon.requestheaders(blocked)
    addon.response(blocked)  # a refusal is not an upstream answer
    addon.responses.close()
    (flow,) = read_flows(state / RESPONSES_FILE)
    assert (flow.request.host, flow.request.path, flow.response.content) == ("api.allowed.test", "/page", b"<p>one</p>")
    assert flow.request.headers["authorization"] == BLANKED.decode()
    assert flow.request.headers["cookie"] == BLANKED.decode()
    assert flow.request.headers["x-goog-api-key"] == BLANKED.decode()  # every header the audit log redacts
    assert check((state / RESPONSES_FILE).read_bytes()) == FlowFile(1, (state / RESPONSES_FILE).stat().st_size, False)
    assert flow.response.headers["set-cookie"] == "id=1"  # the site's answer is kept as it was
    assert addon.responses.counts() == {"kept": 1, "skipped": 0, "bytes": len(b"<p>one</p>")}


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


async def test_a_quiet_session_s_last_flows_reach_the_file_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / RESPONSES_FILE
    store = ResponseStore(path, max_body=100, max_total=1000)
    store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"one"), "allowed.test")
    await asyncio.sleep(0.05)
    store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), b"two"), "allowed.test")
    await asyncio.sleep(1.2)  # nothing else comes: the buffer is flushed by the timer
    assert check(path.read_bytes()).flows == 2
    store.close()


def test_the_byte_budgets_skip_and_count(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / RESPONSES_FILE, max_body=10, max_total=12)
    for body in (b"12345678", b"too long body", b"1234567", b"x"):  # kept, too big, over the total, kept
        store.offer(answered(tflow.tflow(req=tutils.treq(content=b"")), body), "allowed.test")
    store.close()
    assert store.counts() == {"kept": 2, "skipped": 2, "bytes": 9}
    assert [f.response.content for f in read_flows(tmp_path / RESPONSES_FILE)] == [b"12345678", b"x"]


@contextlib.contextmanager
def hermetic_from(recorded: Path, tmp_path: Path) -> Iterator[tuple[Egress, Lookups, Path]]:
    """A second session answering from what a first one recorded (in ``recorded``)."""
    state = tmp_path / "replay"
    _policy(state)
    source = recorded / RESPONSES_FILE
    (state / REPLAY_FILE).write_bytes(source.read_bytes() if source.exists() else b"")
    addon = Egress()
    addon.lookup = lookups = Lookups()
    # mitmdump's own addons declare the server_replay_* options and connection_strategy.
    with taddons.context(Proxyserver(), ServerPlayback(), addon) as tctx:
        tctx.configure(addon, corral_state_dir=str(state), corral_hermetic=True, connection_strategy="lazy", **OPTIONS)
        yield addon, lookups, state


@pytest.fixture
def hermetic(recording, tmp_path: Path) -> Iterator[tuple[Egress, Lookups, Path]]:
    recorder, _, recorded = recording
    recorder.responses.close()
    with hermetic_from(recorded, tmp_path) as session:
        yield session


async def replay_visit(addon: Egress, path: str, host: str = "api.allowed.test") -> http.HTTPFlow:
    connect = connect_flow(host)
    await addon.http_connect(connect)
    flow = tunnel_request(connect, host, path)
    await addon.requestheaders(flow)
    addon.request(flow)
    addon.response(flow)
    return flow


async def test_a_hermetic_session_answers_from_the_recording_without_resolving(recording, tmp_path: Path) -> None:
    recorder, _, recorded = recording
    await record_visit(recorder, "/page", b"first")
    await record_visit(recorder, "/page", b"second")
    await record_visit(recorder, "/other", b"other")
    recorder.responses.close()
    with hermetic_from(recorded, tmp_path) as (addon, lookups, state):
        bodies = [(await replay_visit(addon, "/page")).response.content for _ in range(3)]
        assert bodies == [b"first", b"second", b"second"]  # in recorded order, then the last one again
        other = await replay_visit(addon, "/other")
        assert other.response.content == b"other" and other.is_replay == "response"
        assert lookups.asked == []
        logged = [r for r in records(state) if r["event"] == "request"]
        assert len(logged) == 4 and all(r["replayed"] and r["ip"] is None for r in logged)
        assert not (state / RESPONSES_FILE).exists()  # a replay records no responses of its own


async def test_what_the_recording_lacks_gets_a_not_recorded_page_and_a_block_record(hermetic) -> None:
    addon, _, state = hermetic
    flow = await replay_visit(addon, "/never")
    assert flow.response.status_code == 502
    assert flow.response.headers["X-Corral-Egress"] == "not-recorded"
    assert "Not in the recording" in (flow.response.get_text() or "")
    block = records(state)[-1]
    assert (block["event"], block["rule"], block["status"]) == ("block", "not-recorded", 502)
    assert "/never" in block["reason"]


async def test_policy_still_decides_first_in_a_hermetic_session(recording, tmp_path: Path) -> None:
    recorder, _, recorded = recording
    await record_visit(recorder, "/page", b"recorded")
    recorder.responses.close()
    with hermetic_from(recorded, tmp_path) as (addon, _, state):
        (state / "policy.json").write_text(json.dumps({"allow": ["other.test"]}))
        addon.configure({"corral_state_dir"})
        flow = await replay_visit(addon, "/page")
        assert flow.response.status_code == 403  # recorded, but no longer allowed: refused, not replayed
        assert flow.is_replay is None


async def test_a_hermetic_session_never_dials(hermetic) -> None:
    addon, _, state = hermetic
    connect = connect_flow("api.allowed.test")
    await addon.http_connect(connect)
    assert connect.response is None  # accepted as a tunnel; nothing resolved
    server = connect.server_conn
    server.address = ("api.allowed.test", 443)
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=server, client=connect.client_conn))
    assert server.error and "never connects upstream" in server.error
    assert records(state)[-1]["event"] == "error"


@pytest.mark.parametrize(
    ("strategy", "replay_file", "problem"),
    [("eager", b"", "lazy"), ("lazy", b"this is no flow file", "recorded responses")],
)
async def test_a_hermetic_session_that_cannot_start_fails_closed(
    tmp_path: Path, strategy: str, replay_file: bytes, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    _policy(tmp_path)
    (tmp_path / REPLAY_FILE).write_bytes(replay_file)
    addon = Egress()
    addon.lookup = Lookups()
    with taddons.context(Proxyserver(), ServerPlayback(), addon) as tctx:
        # mitmproxy logs an addon's configure error and carries on: the addon must refuse by itself.
        tctx.configure(
            addon, corral_state_dir=str(tmp_path), corral_hermetic=True, connection_strategy=strategy, **OPTIONS
        )
        assert problem in caplog.text
        assert addon.hermetic and problem in (addon.replay_error or "")
        status = addon.handle_control("gateway", control.Status())
        assert status["hermetic"] is True and problem in status["replay"]["error"]
        flow = await replay_visit(addon, "/page")
        assert flow.response.status_code == 502 and flow.response.headers["X-Corral-Egress"] == "not-recorded"
