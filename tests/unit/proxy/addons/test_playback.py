"""Hermetic playback (corral.proxy.addons.playback): a session answers from what another recorded,
after its policy decided, never resolving or dialling, refusing what the recording lacks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

from corral.proxy import control
from corral.proxy.responses import RESPONSES_FILE

from .harness import Proxy, connect_flow, hermetic_from, record_visit, records, replay_visit


@pytest.fixture
def hermetic(recording, tmp_path: Path) -> Iterator[tuple[Proxy, Any, Path]]:
    recorder, _, recorded = recording
    recorder.shared.responses.close()
    with hermetic_from(recorded, tmp_path) as session:
        yield session, session.shared.policy.lookup, tmp_path / "replay"


async def test_a_hermetic_session_answers_from_the_recording_without_resolving(recording, tmp_path: Path) -> None:
    recorder, _, recorded = recording
    await record_visit(recorder, "/page", b"first")
    await record_visit(recorder, "/page", b"second")
    await record_visit(recorder, "/other", b"other")
    recorder.shared.responses.close()
    with hermetic_from(recorded, tmp_path) as proxy:
        lookups, state = proxy.shared.policy.lookup, tmp_path / "replay"
        bodies = [(await replay_visit(proxy, "/page")).response.content for _ in range(3)]
        assert bodies == [b"first", b"second", b"second"]  # in recorded order, then the last one again
        other = await replay_visit(proxy, "/other")
        assert other.response.content == b"other" and other.is_replay == "response"
        assert lookups.asked == []
        logged = [r for r in records(state) if r["event"] == "request"]
        assert len(logged) == 4 and all(r["replayed"] and r["ip"] is None for r in logged)
        assert not (state / RESPONSES_FILE).exists()  # a replay records no responses of its own


async def test_what_the_recording_lacks_gets_a_not_recorded_page_and_a_block_record(hermetic) -> None:
    proxy, _, state = hermetic
    flow = await replay_visit(proxy, "/never")
    assert flow.response.status_code == 502
    assert flow.response.headers["X-Corral-Egress"] == "not-recorded"
    assert "Not in the recording" in (flow.response.get_text() or "")
    block = records(state)[-1]
    assert (block["event"], block["rule"], block["status"]) == ("block", "not-recorded", 502)
    assert "/never" in block["reason"]


async def test_policy_still_decides_first_in_a_hermetic_session(recording, tmp_path: Path) -> None:
    recorder, _, recorded = recording
    await record_visit(recorder, "/page", b"recorded")
    recorder.shared.responses.close()
    with hermetic_from(recorded, tmp_path) as proxy:
        state = tmp_path / "replay"
        (state / "policy.json").write_text(json.dumps({"allow": ["other.test"]}))
        proxy.configure({"corral_state_dir"})
        flow = await replay_visit(proxy, "/page")
        assert flow.response.status_code == 403  # recorded, but no longer allowed: refused, not replayed
        assert flow.is_replay is None


async def test_a_hermetic_session_never_dials(hermetic) -> None:
    proxy, _, state = hermetic
    connect = connect_flow("api.allowed.test")
    await proxy.http_connect(connect)
    assert connect.response is None  # accepted as a tunnel; nothing resolved
    server = connect.server_conn
    server.address = ("api.allowed.test", 443)
    await proxy.server_connect(connect, server)
    assert server.error and "never connects upstream" in server.error
    assert records(state)[-1]["event"] == "error"


@pytest.mark.parametrize(
    ("strategy", "replay_file", "problem"),
    [("eager", b"", "lazy"), ("lazy", b"this is no flow file", "recorded responses")],
)
async def test_a_hermetic_session_that_cannot_start_fails_closed(
    tmp_path: Path, strategy: str, replay_file: bytes, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / RESPONSES_FILE).write_bytes(replay_file)
    # mitmproxy logs an addon's configure error and carries on: the addon must refuse by itself.
    with hermetic_from(recorded, tmp_path, connection_strategy=strategy) as proxy:
        assert problem in caplog.text
        assert proxy.shared.policy.hermetic and problem in (proxy.shared.replay.error or "")
        status = proxy.control("gateway", control.Status())
        assert status["hermetic"] is True and problem in status["replay"]["error"]
        flow = await replay_visit(proxy, "/page")
        assert flow.response.status_code == 502 and flow.response.headers["X-Corral-Egress"] == "not-recorded"
