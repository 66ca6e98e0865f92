"""The control channel's typed messages (corral.contracts.control): what one side encodes, the
other parses back to the same message; answers keep to the wire's shape, and an older proxy's
answer without generations, heads or secrets reads as None."""

from __future__ import annotations

import json

import pytest

from corral.contracts import control
from corral.errors import InvalidMessage

PLACEHOLDER = "corral_secret_" + "a" * 32


@pytest.mark.parametrize(
    "message",
    [
        control.Hello("t0ken"),
        control.SetPolicy(("a.test", "GET b.test/v1/"), "report", "api-key:owner"),
        control.Status(),
        control.ActionEvent("a1.beef", "start", ack=True, actor="human:lnk_x"),
        control.ActionEvent("a1.beef", "end"),
        control.LeaseEvent("taken", "human:lnk_x", "agent"),
        control.LinkEvent("created", "lnk_x", "view", "api-key:owner", 1733000000.5),
        control.LifetimeEvent("api-key:owner", 1733003600.25, 1733000000.5),
        control.VolumeEvent("claimed", "work", 1024, 2048),
        control.PreviewEvent("created", "prv_x", 3000, "api-key:owner", 1733000000.5),
        control.PreviewEvent("opened", "prv_x", 3000, "preview", 1733000000.5, "127.0.0.1:50000"),
        control.PreviewEvent("closed", "prv_x", 3000, "preview", 1733000000.5, "[::1]:50000", 10, 20),
        control.SessionEvent("pause", "owner", (("/workspace", 10240), ("/home/agent", 0)), 2),
        control.DownloadEvent("started", "c341624d-6c3a", "a.pdf", "https://x.test/a.pdf", 0, "agent", "a3.beef"),
        control.DownloadEvent("fetched", "c341624d-6c3a", "a.pdf", "https://x.test/a.pdf", 1664, "api-key:owner"),
        control.PutSecrets(
            (
                control.SecretEntry("API_TOKEN", PLACEHOLDER, "tok-the-value-42", ("api.test",), ("header",)),
                control.SecretEntry("OTHER", "corral_secret_" + "b" * 32, None, ("api.test",), ("query", "body")),
            ),
            "gateway:reassert",
        ),
    ],
    ids=lambda message: type(message).__name__,
)
def test_what_one_side_encodes_the_other_parses_back(message: control.Message) -> None:
    line = control.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert control.parse_message(line, InvalidMessage) == message


def test_a_secret_value_is_never_in_a_repr() -> None:
    entry = control.SecretEntry("API_TOKEN", PLACEHOLDER, "tok-the-value-42", ("api.test",))
    assert "tok-the-value-42" not in repr(control.PutSecrets((entry,)))
    assert "t0ken" not in repr(control.Hello("t0ken"))


def test_answers_keep_the_wire_s_shape_and_an_older_proxy_s_reads_as_none() -> None:
    reply = control.Reply(
        allow=("a.test",), mode="enforce", generation=2, head=control.Head(3, "h3"), actions=(), hermetic=False
    )
    wire = reply.to_json()
    assert wire == {
        "ok": True,
        "allow": ["a.test"],
        "mode": "enforce",
        "generation": 2,
        "head": {"seq": 3, "hash": "h3"},
        "actions": [],
        "hermetic": False,
    }
    assert control.Reply.parse(wire, InvalidMessage) == reply
    older = control.Reply.parse({"ok": True, "allow": ["a.test"], "mode": "enforce"}, InvalidMessage)
    assert (older.generation, older.head, older.secrets, older.replay) == (None, None, None, None)
    assert control.Reply.parse({"ok": True, "head": {"seq": -1, "hash": "x"}}, InvalidMessage).head is None
    with pytest.raises(InvalidMessage) as wrong:
        control.Reply.parse({"ok": True, "generation": "2"}, InvalidMessage)
    assert wrong.value.field == "generation"
    refusal = control.Refusal("'mode' must be one of enforce, report", "invalid_field", "mode")
    assert refusal.to_json() == {
        "ok": False,
        "code": "invalid_field",
        "error": "'mode' must be one of enforce, report",
        "field": "mode",
    }
    assert control.Refusal("unknown token").to_json() == {"ok": False, "error": "unknown token"}


@pytest.mark.parametrize("times", [{"expires_at": "soon", "previous_expires_at": 1.0}, {"expires_at": 1.0}])
def test_a_lifetime_report_without_its_times_is_refused(times: dict[str, object]) -> None:
    line = control.encode({"op": "lifetime", "actor": "api-key:owner", **times})
    with pytest.raises(InvalidMessage, match="unix seconds"):
        control.parse_message(line, InvalidMessage)


@pytest.mark.parametrize(
    ("fields", "blamed"),
    [
        ({"change": "taken"}, "change"),
        ({"volume": "a b"}, "volume"),
        ({"size_mb": -1}, "size_mb"),
        ({"used_bytes": True}, "used_bytes"),
        ({"used_bytes": 1.5}, "used_bytes"),
    ],
)
def test_a_volume_event_out_of_shape_is_refused_naming_its_field(fields: dict[str, object], blamed: str) -> None:
    wire = {"op": "volume", "change": "released", "volume": "work", "size_mb": 64, "used_bytes": 0, **fields}
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(json.dumps(wire).encode(), InvalidMessage)
    assert refused.value.field == blamed


@pytest.mark.parametrize(
    ("fields", "blamed"),
    [
        ({"change": "snapshot"}, "change"),
        ({"saved": {"/w": -1}}, "saved"),
        ({"saved": {"/w": True}}, "saved"),
        ({"saved": {f"/d{i}": 1 for i in range(9)}}, "saved"),
        ({"saved": {"/" + "x" * 300: 1}}, "saved"),
        ({"tabs": "2"}, "tabs"),
        ({"actor": "not an id"}, "actor"),
    ],
)
def test_a_session_report_is_checked_field_by_field(fields: dict[str, object], blamed: str) -> None:
    """What lands in the audit chain is bounded and typed: a change of the two, sizes as counts."""
    message = {"op": "session", "change": "pause", "actor": "owner", "saved": {"/workspace": 1}, "tabs": 1, **fields}
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(control.encode(message), InvalidMessage)
    assert refused.value.field == blamed


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"change": "used"}, "change"),
        ({"port": 70000}, "port"),
        ({"remote": "1.2.3.4:5\nforged"}, "remote"),
        ({"bytes_in": -1}, "bytes_in"),
        ({"preview": "prv x"}, "preview"),
    ],
)
def test_a_preview_event_s_fields_are_checked(change: dict[str, object], field: str) -> None:
    good = control.PreviewEvent("closed", "prv_x", 3000, "preview", 1.0, "127.0.0.1:1", 1, 2).to_json()
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(json.dumps({**good, **change}).encode(), InvalidMessage)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"change": "saved"}, "change"),
        ({"download": "../etc"}, "download"),
        ({"bytes": -1}, "bytes"),
        ({"url": "x" * 5000}, "url"),
        ({"action": "a b"}, "action"),
        ({"name": ""}, "name"),
    ],
)
def test_a_download_event_s_fields_are_checked(change: dict[str, object], field: str) -> None:
    good = control.DownloadEvent("completed", "guid-1", "a.bin", "https://x.test/a", 3, "cdp:c1", "c1.c1").to_json()
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(json.dumps({**good, **change}).encode(), InvalidMessage)
    assert refused.value.field == field


def test_a_read_of_the_state_and_its_chunk_cross_the_wire_whole() -> None:
    message = control.ReadState("responses", 1 << 40, 4096)
    assert control.parse_message(control.encode(message), InvalidMessage) == message
    default = control.parse_message(b'{"op":"read","file":"audit","offset":0}', InvalidMessage)
    assert default == control.ReadState("audit", 0, control.MAX_READ_BYTES)
    reply = control.Reply(chunk=control.FileChunk("audit", 5, b"\x00\xffline\n", 12), marks=(control.Head(256, "ab"),))
    assert control.Reply.parse(json.loads(control.encode(reply)), InvalidMessage) == reply
    after = control.ReadState("audit", 10, 100, after=512)
    assert control.parse_message(control.encode(after), InvalidMessage) == after
    for marks in ([{"seq": -1, "hash": "x"}], "x", [{"seq": 1, "hash": "x"}] * (control.MAX_MARKS + 1)):
        with pytest.raises(InvalidMessage, match="'marks' must be"):
            control.Reply.parse({"ok": True, "marks": marks}, InvalidMessage)


@pytest.mark.parametrize(
    ("chunk", "blamed"),
    [
        ({"file": "policy", "offset": 0, "data": "", "size": 0}, "chunk"),
        ({"file": "audit", "offset": -1, "data": "", "size": 0}, "chunk"),
        ({"file": "audit", "offset": True, "data": "", "size": 0}, "chunk"),
        ({"file": "audit", "offset": 0, "data": "not base64!", "size": 20}, "chunk.data"),
        ({"file": "audit", "offset": 0, "data": "QUJD", "size": 2}, "chunk"),  # 3 bytes past a size of 2
        (
            {"file": "audit", "offset": 0, "data": "QUJD" * (control.MAX_READ_BYTES // 3 + 2), "size": 1 << 30},
            "chunk.data",
        ),
        ("audit", "chunk"),
    ],
)
def test_a_chunk_that_is_not_whole_or_not_within_its_file_is_refused(chunk: object, blamed: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        control.Reply.parse({"ok": True, "chunk": chunk}, InvalidMessage)
    assert refused.value.field == blamed and refused.value.code == "invalid_field"
