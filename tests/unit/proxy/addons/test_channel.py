"""The control channel (corral.proxy.addons.channel): the gateway sets the policy (persisted and
recorded before it takes effect) and reads the status; the controller reports agent actions."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

from corral.contracts.placeholders import value_digest
from corral.proxy import control
from corral.proxy.audit import verify

from .harness import Proxy, connect_flow, records, session_proxy


async def test_policy_change_is_logged_persisted_and_gateway_only(egress) -> None:
    proxy, _, state = egress
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", control.SetPolicy(("x.test",), "enforce", "me"))
    with pytest.raises(ValueError, match="wildcard"):
        proxy.control("gateway", control.SetPolicy(("a*.test",), "enforce", "me"))
    reply = proxy.control("gateway", control.SetPolicy(("NEW.test.",), "enforce", "api-key:k1"))
    record = records(state)[-1]
    assert reply == {
        "ok": True,
        "allow": ["new.test"],
        "mode": "enforce",
        "generation": 1,
        "head": {"seq": record["seq"], "hash": record["hash"]},  # the chain's head includes the change
    }
    assert record["event"] == "policy"
    assert record["allow"] == ["new.test"] and record["actor"] == "api-key:k1" and record["generation"] == 1
    assert record["previous_allow"] == ["allowed.test", "*.allowed.test", "GET,HEAD other.test/docs/"]
    assert json.loads((state / "policy.json").read_text()) == {
        "allow": ["new.test"],
        "mode": "enforce",
        "generation": 1,
    }
    with pytest.raises(ValueError, match="only the controller"):
        proxy.control("gateway", control.ActionEvent("a1", "start"))
    assert verify(state / "audit.jsonl").ok


async def _serve(proxy: Proxy) -> int:
    """The control channel on a free loopback port (what the sidecar binds to its session address)."""
    from mitmproxy import ctx

    ctx.options.update(corral_control_host="127.0.0.1", corral_control_port=0)
    await proxy.running()
    assert proxy.channel.server is not None
    return int(proxy.channel.server.sockets[0].getsockname()[1])


async def _exchange(port: int, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    replies = []
    try:
        for message in messages:
            writer.write(control.encode(message))
            await writer.drain()
            replies.append(json.loads(await reader.readline()))
    finally:
        writer.close()
    return replies


async def test_a_forged_action_id_gets_a_structured_refusal_and_never_reaches_the_log(egress) -> None:
    proxy, _, state = egress
    port = await _serve(proxy)
    try:
        hello, refused, accepted = await _exchange(
            port,
            {"op": "hello", "token": "ctl-token"},
            {"op": "action", "id": 'a1\n{"event":"forged"}', "phase": "start", "ack": True},
            {"op": "action", "id": "a2.beef", "phase": "start", "ack": True},
        )
        flow = connect_flow("allowed.test")
        await proxy.http_connect(flow)
    finally:
        await proxy.done()
    assert hello == {"ok": True, "role": "controller"}
    assert refused == {
        "ok": False,
        "code": "invalid_field",
        "field": "id",
        "error": "'id' must be 1 to 64 characters from A-Z a-z 0-9 _ . : -",
    }
    assert accepted == {"ok": True}  # the connection carries on
    assert proxy.shared.actions.ids() == ["a2.beef"]
    assert records(state)[-1]["action"] == "a2.beef"
    assert "forged" not in (state / "audit.jsonl").read_text()


async def test_the_policy_generation_counts_changes_and_survives_a_restart(egress, tmp_path: Path) -> None:
    proxy, _, state = egress
    port = await _serve(proxy)
    token = {"op": "hello", "token": "gw-token"}
    try:
        _, first = await _exchange(port, token, {"op": "status"})
        _, changed = await _exchange(port, token, {"op": "policy", "allow": ["a.test"], "mode": "report", "actor": "t"})
        _, now = await _exchange(port, token, {"op": "status"})
    finally:
        await proxy.done()
    assert first["generation"] == 0 and changed["generation"] == 1 and now["generation"] == 1
    assert (now["allow"], now["mode"]) == (["a.test"], "report")
    last = records(state)[-1]
    assert now["head"] == {"seq": last["seq"], "hash": last["hash"]}
    # A restarted proxy (same state dir) continues the generation and the chain.
    with session_proxy(
        corral_session="ses_test", corral_state_dir=str(state), corral_gateway_token="gw-token"
    ) as again:
        status = again.control("gateway", control.Status())
        assert status is not None
        assert (status["generation"], status["allow"], status["mode"]) == (1, ["a.test"], "report")
        assert status["head"] == now["head"]
        await again.done()


def test_tokens_come_from_a_file_off_the_command_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"gateway": "gw-file", "controller": "ctl-file"}))
    with session_proxy(corral_state_dir=str(tmp_path), corral_tokens_file=str(tokens)) as proxy:
        channel = proxy.channel
        assert channel.role("gw-file") == "gateway" and channel.role("ctl-file") == "controller"
        assert channel.role("") is None and channel.role("gw-token") is None


async def test_a_hello_is_answered_once_and_a_stranger_is_refused(egress) -> None:
    proxy, _, _ = egress
    port = await _serve(proxy)
    try:
        malformed, stranger = await _exchange(port, {"op": "nope"}, {"op": "hello", "token": "guess"})
        (refused,) = await _exchange(port, {"op": "status"})
    finally:
        await proxy.done()
    assert malformed["ok"] is False and malformed["code"] == "invalid_request"  # still no role: try again
    assert stranger == {"ok": False, "error": "unknown token"}
    assert refused == {"ok": False, "error": "unknown token"}  # a message before any hello


@pytest.mark.parametrize("content", ["{not json", "[]"])
def test_an_unreadable_tokens_file_is_an_options_error(tmp_path: Path, content: str) -> None:
    from mitmproxy import exceptions

    tokens = tmp_path / "tokens.json"
    tokens.write_text(content)
    with session_proxy() as proxy, pytest.raises(exceptions.OptionsError, match="corral_tokens_file"):
        proxy.tctx.configure(proxy.addons[0], corral_tokens_file=str(tokens))


SECRET = {
    "name": "TOKEN",
    "placeholder": "corral_secret_" + "1" * 32,
    "value": "s3cret-value-123",
    "allow": ["GET allowed.test/v1/"],
    "in": ["header"],
}


def _secrets(*entries: dict[str, Any]) -> Any:
    line = json.dumps({"op": "secrets", "actor": "api-key:k1", "secrets": list(entries)}).encode()
    return control.parse_message(line)


async def test_secrets_are_gateway_only_recorded_before_they_take_effect_and_in_the_status(egress) -> None:
    proxy, _, state = egress
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", _secrets(SECRET))
    assert not proxy.shared.secrets.active
    reply = proxy.control("gateway", _secrets(SECRET))
    record = records(state)[-1]
    assert reply == {
        "ok": True,
        "secrets": {
            "generation": 1,
            "names": ["TOKEN"],
            "loaded": True,
            "digests": {"TOKEN": value_digest("gw-token", b"s3cret-value-123")},
        },
        "head": {"seq": record["seq"], "hash": record["hash"]},
    }
    assert {k: v for k, v in record.items() if k not in ("seq", "time", "prev", "hash")} == {
        "session": "ses_test",
        "event": "secrets",
        "actor": "api-key:k1",
        "generation": 1,
        "added": ["TOKEN"],
        "rotated": [],
        "revoked": [],
        "restored": [],
        "bindings": {"TOKEN": {"allow": ["GET allowed.test/v1/"], "in": ["header"]}},
    }
    rotated = proxy.control("gateway", _secrets({**SECRET, "value": "another-value-456"}))
    assert rotated is not None and records(state)[-1]["rotated"] == ["TOKEN"]
    status = proxy.control("gateway", control.Status())
    assert status is not None and status["secrets"] == {
        "generation": 2,
        "names": ["TOKEN"],
        "loaded": True,
        "digests": {"TOKEN": value_digest("gw-token", b"another-value-456")},
    }
    saved = (state / "secrets.json").read_text()
    assert "s3cret-value-123" not in saved and "another-value-456" not in saved
    assert "s3cret-value-123" not in (state / "audit.jsonl").read_text()
    assert verify(state / "audit.jsonl").ok


async def test_a_secrets_message_that_would_change_a_placeholder_changes_nothing(egress) -> None:
    proxy, _, state = egress
    proxy.control("gateway", _secrets(SECRET))
    port = await _serve(proxy)
    before = (len(records(state)), (state / "secrets.json").read_bytes())
    try:
        moved = {**SECRET, "placeholder": "corral_secret_" + "2" * 32}
        hello, refused = await _exchange(
            port,
            {"op": "hello", "token": "gw-token"},
            {"op": "secrets", "actor": "api-key:k1", "secrets": [moved]},
        )
    finally:
        await proxy.done()
    assert hello["ok"] is True
    assert refused == {
        "ok": False,
        "code": "invalid_field",
        "error": "TOKEN's placeholder may not change",
        "field": "secrets.TOKEN.placeholder",
    }
    assert (len(records(state)), (state / "secrets.json").read_bytes()) == before
    assert proxy.shared.secrets.secrets["TOKEN"].placeholder == SECRET["placeholder"]


async def test_the_status_shows_each_value_as_a_digest_keyed_with_the_gateway_token(egress) -> None:
    proxy, _, _ = egress
    proxy.control("gateway", _secrets(SECRET))
    status = proxy.control("gateway", control.Status())
    assert status is not None
    digest = status["secrets"]["digests"]["TOKEN"]
    # keyed: neither the value nor its bare hash is in the answer, and another key gives another digest
    assert digest == value_digest("gw-token", b"s3cret-value-123") != value_digest("other", b"s3cret-value-123")
    assert hashlib.sha256(b"s3cret-value-123").hexdigest() not in json.dumps(status)
    assert "s3cret-value-123" not in json.dumps(status)


async def test_lease_changes_are_control_records_from_the_controller_only(egress) -> None:
    proxy, _, state = egress
    change = control.LeaseEvent("taken", "human:lnk_3kq9x0a1b2c4", "agent")
    with pytest.raises(ValueError, match="only the controller"):
        proxy.control("gateway", change)
    assert proxy.control("controller", change) is None  # no ack: the lease never waits on the audit
    record = records(state)[-1]
    assert (record["event"], record["change"], record["holder"], record["previous"]) == (
        "control",
        "taken",
        "human:lnk_3kq9x0a1b2c4",
        "agent",
    )
    assert verify(state / "audit.jsonl").ok


async def test_link_changes_are_link_records_from_the_gateway_only(egress) -> None:
    proxy, _, state = egress
    made = control.LinkEvent("created", "lnk_3kq9x0a1b2c4", "control", "key-0123456789ab", 1733000000.5)
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", made)
    reply = proxy.control("gateway", made)
    record = records(state)[-1]
    assert reply == {"ok": True, "head": {"seq": record["seq"], "hash": record["hash"]}}  # the gateway anchors it
    assert {k: record[k] for k in ("event", "link", "mode", "change", "actor", "expires_at")} == {
        "event": "link",
        "link": "lnk_3kq9x0a1b2c4",
        "mode": "control",
        "change": "created",
        "actor": "key-0123456789ab",
        "expires_at": 1733000000.5,
    }


async def test_a_lifetime_change_is_a_lifetime_record_from_the_gateway_only(egress) -> None:
    proxy, _, state = egress
    changed = control.LifetimeEvent("api-key:owner", 1733003600.25, 1733000000.5)
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", changed)  # the sandbox's side may not move its own expiry in the log
    reply = proxy.control("gateway", changed)
    record = records(state)[-1]
    assert reply == {"ok": True, "head": {"seq": record["seq"], "hash": record["hash"]}}
    assert {k: record[k] for k in ("event", "actor", "expires_at", "previous_expires_at")} == {
        "event": "lifetime",
        "actor": "api-key:owner",
        "expires_at": 1733003600.25,
        "previous_expires_at": 1733000000.5,
    }


async def test_volume_claims_and_releases_are_volume_records_from_the_gateway_only(egress) -> None:
    proxy, _, state = egress
    released = control.VolumeEvent("released", "work", 64, 5 << 20)
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", released)
    reply = proxy.control("gateway", released)
    record = records(state)[-1]
    assert reply == {"ok": True, "head": {"seq": record["seq"], "hash": record["hash"]}}
    assert {k: record[k] for k in ("event", "volume", "change", "size_mb", "used_bytes")} == {
        "event": "volume",
        "volume": "work",
        "change": "released",
        "size_mb": 64,
        "used_bytes": 5 << 20,
    }


async def test_a_pause_and_a_resume_are_session_records_from_the_gateway_only(egress) -> None:
    proxy, _, state = egress
    paused = control.SessionEvent("pause", "owner", (("/workspace", 20480), ("/home/agent", 10240)), 2)
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", paused)
    reply = proxy.control("gateway", paused)
    record = records(state)[-1]
    assert reply == {"ok": True, "head": {"seq": record["seq"], "hash": record["hash"]}}
    assert {k: record[k] for k in ("event", "change", "actor", "saved", "tabs")} == {
        "event": "session",
        "change": "pause",
        "actor": "owner",
        "saved": {"/workspace": 20480, "/home/agent": 10240},
        "tabs": 2,
    }
    assert verify(state / "audit.jsonl").ok


async def test_a_wrong_role_s_report_is_refused_and_the_connection_carries_on(egress) -> None:
    proxy, _, state = egress
    port = await _serve(proxy)
    link = {"op": "link", "change": "used", "link": "lnk_x", "mode": "view", "actor": "key-1", "expires_at": 1.0}
    try:
        hello, refused, accepted = await _exchange(
            port,
            {"op": "hello", "token": "ctl-token"},
            link,  # the controller may not report links
            {"op": "action", "id": "h1.beef", "phase": "start", "ack": True, "actor": "human:lnk_x"},
        )
    finally:
        await proxy.done()
    assert hello == {"ok": True, "role": "controller"}
    assert refused == {"ok": False, "code": "invalid_request", "error": "only the gateway may do that"}
    assert accepted == {"ok": True}
    assert proxy.shared.actions.actor("h1.beef") == "human:lnk_x"
    assert all(r["event"] != "link" for r in records(state))


async def test_a_download_s_life_is_the_controller_s_to_report_and_a_fetch_the_gateway_s(egress) -> None:
    proxy, _, state = egress
    began = control.DownloadEvent("started", "guid-1", "r.pdf", "https://x.test/r.pdf", 0, "agent", "a3.beef")
    fetched = control.DownloadEvent("fetched", "guid-1", "r.pdf", "https://x.test/r.pdf", 5, "api-key:owner")
    with pytest.raises(ValueError, match="the gateway reports fetches"):
        proxy.control("gateway", began)  # the gateway may not say what the browser did
    with pytest.raises(ValueError, match="the gateway reports fetches"):
        proxy.control("controller", fetched)  # nor the sandbox that someone fetched its file
    assert proxy.control("controller", began) is None  # no ack: a download never waits on the audit
    reply = proxy.control("gateway", fetched)
    started, sent = records(state)[-2:]
    assert reply == {"ok": True, "head": {"seq": sent["seq"], "hash": sent["hash"]}}
    assert {k: started[k] for k in ("event", "download", "name", "url", "change", "bytes", "actor", "action")} == {
        "event": "download",
        "download": "guid-1",
        "name": "r.pdf",
        "url": "https://x.test/r.pdf",
        "change": "started",
        "bytes": 0,
        "actor": "agent",
        "action": "a3.beef",
    }
    assert (sent["change"], sent["bytes"], sent["actor"]) == ("fetched", 5, "api-key:owner")
    assert verify(state / "audit.jsonl").ok


async def test_the_gateway_reads_the_audit_log_from_an_offset_in_bounded_chunks(egress) -> None:
    proxy, _, state = egress
    proxy.control("gateway", control.LinkEvent("created", "lnk_3kq9x0a1b2c4", "view", "key-0123456789ab", 1.0))
    whole = (state / "audit.jsonl").read_bytes()
    first = proxy.control("gateway", control.ReadState("audit", 0, 10))
    assert first is not None
    chunk = first["chunk"]
    assert (chunk["file"], chunk["offset"], chunk["size"]) == ("audit", 0, len(whole))
    assert base64.b64decode(chunk["data"]) == whole[:10]
    last = records(state)[-1]
    assert first["head"] == {"seq": last["seq"], "hash": last["hash"]}  # the memory's, for the gateway's copy
    assert first["marks"] == []  # every 256th record's: none yet
    rest = proxy.control("gateway", control.ReadState("audit", 10))
    assert rest is not None and base64.b64decode(rest["chunk"]["data"]) == whole[10:]
    at_end = proxy.control("gateway", control.ReadState("audit", len(whole)))
    assert at_end is not None and at_end["chunk"]["data"] == "" and at_end["chunk"]["size"] == len(whole)


async def test_a_read_of_the_state_is_the_gateway_s_alone_and_bounded_to_its_files(egress) -> None:
    proxy, _, state = egress
    with pytest.raises(ValueError, match="only the gateway"):
        proxy.control("controller", control.ReadState("audit", 0))
    size = (state / "audit.jsonl").stat().st_size
    with pytest.raises(ValueError, match=r"offset \d+ is past the end of audit.jsonl") as refused:
        proxy.control("gateway", control.ReadState("audit", size + 1))
    assert getattr(refused.value, "field", None) == "offset"
    # Nothing recorded yet: the responses read as empty, not as an error.
    empty = proxy.control("gateway", control.ReadState("responses", 0))
    assert empty is not None and empty["chunk"]["size"] == 0 and "head" not in empty
    port = await _serve(proxy)
    hello = {"op": "hello", "token": "gw-token"}
    replies = await _exchange(
        port,
        hello,
        {"op": "read", "file": "../policy.json", "offset": 0},
        {"op": "read", "file": "audit", "offset": -1},
        {"op": "read", "file": "audit", "offset": 0, "limit": control.MAX_READ_BYTES + 1},
        {"op": "read", "file": "audit", "offset": 0, "limit": 0},
    )
    assert [(r.get("code"), r.get("field")) for r in replies[1:]] == [
        ("invalid_field", "file"),
        ("invalid_field", "offset"),
        ("invalid_field", "limit"),
        ("invalid_field", "limit"),
    ]


async def test_a_read_of_the_responses_writes_out_what_the_store_still_buffers(recording) -> None:
    from .harness import record_visit

    proxy, _, state = recording
    await record_visit(proxy, "/one", b"first answer")
    buffered = (state / "responses.mitm").stat().st_size if (state / "responses.mitm").exists() else 0
    reply = proxy.control("gateway", control.ReadState("responses", 0))
    assert reply is not None
    data = base64.b64decode(reply["chunk"]["data"])
    assert len(data) == reply["chunk"]["size"] > buffered
    assert data == (state / "responses.mitm").read_bytes() and b"first answer" in data


async def test_a_read_of_the_audit_carries_the_chains_marks_past_the_copys_seq(egress) -> None:
    from corral.proxy.audit import MARK_EVERY

    proxy, _, state = egress
    for n in range(2 * MARK_EVERY):
        proxy.control("gateway", control.LifetimeEvent("key-0123456789ab", float(n), 0.0))
    by_seq = {r["seq"]: r["hash"] for r in records(state)}
    reply = proxy.control("gateway", control.ReadState("audit", 0, 10, after=MARK_EVERY - 1))
    assert reply is not None
    assert reply["marks"] == [{"seq": s, "hash": by_seq[s]} for s in (MARK_EVERY, 2 * MARK_EVERY) if s in by_seq]
    past = proxy.control("gateway", control.ReadState("audit", 0, 10, after=MARK_EVERY))
    assert past is not None and all(m["seq"] > MARK_EVERY for m in past["marks"])
