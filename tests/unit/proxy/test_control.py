"""The control channel's wire format (corral.proxy.control): messages parsed or refused with a
structured reply; a caller's failures are ControlErrors of the project's error tree."""

from __future__ import annotations

import asyncio
import json

import pytest

from corral.errors import ControlError, CorralError, ErrorCode, InvalidMessage
from corral.proxy import control


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"nope", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"op":"x"}', "unknown op"),
        (b'{"op":"policy","allow":"a"}', "list of strings"),
        (b'{"op":"policy","allow":[],"mode":"off"}', "mode"),
        (b'{"op":"action","id":"a","phase":"middle"}', "phase"),
        (b'{"op":"hello"}', "token"),
    ],
)
def test_control_messages_are_validated(line: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        control.parse_message(line)


@pytest.mark.parametrize(
    "action_id",
    ["", "a" * 65, "a1\nforged", "a1\r", "a 1", "a1\u2028", "é1", "a1/../x", "<script>", 7, None, ["a1"]],
)
def test_action_ids_are_short_tokens_without_newlines(action_id: object) -> None:
    line = json.dumps({"op": "action", "id": action_id, "phase": "start"}).encode()
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(line)
    assert refused.value.reply() == {
        "ok": False,
        "code": "invalid_field",
        "field": "id",
        "error": "'id' must be 1 to 64 characters from A-Z a-z 0-9 _ . : -",
    }


@pytest.mark.parametrize("action_id", ["a1.ab3f", "a" * 64, "act_1", "a:1-2.x"])
def test_good_action_ids_pass(action_id: str) -> None:
    line = json.dumps({"op": "action", "id": action_id, "phase": "end"}).encode()
    assert control.parse_message(line) == control.ActionEvent(action_id, "end")


def test_control_refusal_codes_are_error_codes() -> None:
    assert set(control.CODES) <= {str(code) for code in ErrorCode}


async def _proxy_answering(*replies: dict[str, object]) -> asyncio.Server:
    """A stand-in proxy that answers each line with the next of ``replies``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for reply in replies:
            if not await reader.readline():
                break
            writer.write(control.encode(dict(reply)))
            await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_a_refusal_is_a_control_error_with_the_proxy_s_code() -> None:
    hello = {"ok": True, "role": "gateway"}
    refusal = {"ok": False, "code": "invalid_field", "error": "'mode' must be one of enforce, report"}
    async with await _proxy_answering(hello, refusal) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ControlError, match="'mode' must be") as refused:
            await control.call("127.0.0.1", port, "token", control.SetPolicy((), "off"))
    assert isinstance(refused.value, CorralError) and refused.value.code == "invalid_field"
    async with await _proxy_answering({"ok": False, "error": "unknown token"}) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ControlError, match="unknown token") as stranger:
            await control.call("127.0.0.1", port, "guess", control.Status())
    assert stranger.value.code == control.EGRESS_UNAVAILABLE
    async with await _proxy_answering(hello, {"ok": True, "generation": 2}) as server:
        port = server.sockets[0].getsockname()[1]
        answer = await control.call("127.0.0.1", port, "token", control.Status())
        assert answer.to_json() == {"ok": True, "generation": 2}


async def test_an_unreachable_proxy_is_a_control_error_with_a_stable_code() -> None:
    async with await _proxy_answering() as server:
        port = server.sockets[0].getsockname()[1]
    # The port is closed now: nobody answers there.
    with pytest.raises(ControlError, match="not reachable") as gone:
        await control.call("127.0.0.1", port, "token", control.Status())
    assert isinstance(gone.value, CorralError) and gone.value.code == "egress_unavailable"
    with pytest.raises(ControlError, match="not reachable") as gone_too:
        control.call_blocking("127.0.0.1", port, "token", control.Status())
    assert gone_too.value.code == "egress_unavailable"


# -- the secrets op -------------------------------------------------------------------------------

PLACEHOLDER = "corral_secret_" + "a" * 32
VALUE = "ghp_" + "v" * 36


def _secrets_line(*entries: dict[str, object], **extra: object) -> bytes:
    return json.dumps({"op": "secrets", "actor": "api-key:k1", "secrets": list(entries), **extra}).encode()


def _entry(**fields: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": "GITHUB_TOKEN",
        "placeholder": PLACEHOLDER,
        "value": VALUE,
        "allow": ["GET,POST api.example.test/v1/"],
        "in": ["header"],
    }
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not None or k == "value"}


def test_the_secrets_op_parses_into_frozen_secrets_with_parsed_bindings() -> None:
    message = control.parse_message(
        _secrets_line(_entry(), _entry(name="OTHER", placeholder="corral_secret_" + "b" * 32))
    )
    assert isinstance(message, control.SetSecrets) and message.actor == "api-key:k1"
    first = message.secrets[0]
    assert (first.name, first.placeholder, first.value, first.locations) == (
        "GITHUB_TOKEN",
        PLACEHOLDER,
        VALUE.encode(),
        ("header",),
    )
    assert [str(rule) for rule in first.allow] == ["GET,POST api.example.test/v1/"]
    assert VALUE not in repr(message)
    default = control.parse_message(_secrets_line({k: v for k, v in _entry().items() if k != "in"}))
    assert isinstance(default, control.SetSecrets) and default.secrets[0].locations == ("header",)
    kept = control.parse_message(_secrets_line(_entry(value=None)))
    assert isinstance(kept, control.SetSecrets) and kept.secrets[0].value is None  # keep the value held


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ([_entry(name="lower")], "secrets.lower"),
        ([_entry(name="PATH")], "secrets.PATH"),
        ([_entry(placeholder="corral_secret_short")], "secrets.GITHUB_TOKEN.placeholder"),
        ([_entry(value="short")], "secrets.GITHUB_TOKEN.value"),
        ([_entry(value="x" * 5000)], "secrets.GITHUB_TOKEN.value"),
        ([_entry(value="line\nbreak!")], "secrets.GITHUB_TOKEN.value"),
        ([_entry(value=12345678)], "secrets.GITHUB_TOKEN.value"),
        ([_entry(allow=[])], "secrets.GITHUB_TOKEN.allow"),
        ([_entry(allow=["x.test"] * 17)], "secrets.GITHUB_TOKEN.allow"),
        ([_entry(allow=["FETCH x.test"])], "secrets.GITHUB_TOKEN.allow"),
        ([_entry(**{"in": []})], "secrets.GITHUB_TOKEN.in"),
        ([_entry(**{"in": ["cookie"]})], "secrets.GITHUB_TOKEN.in"),
        ([_entry(), _entry()], "secrets.GITHUB_TOKEN"),
        ([_entry(), _entry(name="B")], "secrets.B.placeholder"),
        ([_entry(), "x"], "secrets[1]"),
        ([_entry(name=f"S{i}", placeholder=f"corral_secret_{i:032x}") for i in range(33)], "secrets"),
    ],
)
def test_a_bad_secrets_message_is_refused_whole_naming_the_field_never_the_value(
    entries: list[object], field: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        control.parse_message(_secrets_line(*entries))  # type: ignore[arg-type]
    reply = refused.value.reply()
    assert reply["code"] == ErrorCode.INVALID_FIELD and reply["field"] == field
    values = [e["value"] for e in entries if isinstance(e, dict) and isinstance(e.get("value"), str)]
    assert all(value not in reply["error"] for value in values)


def test_a_full_set_of_secrets_fits_on_one_line() -> None:
    entries = [_entry(name=f"S{i}", placeholder=f"corral_secret_{i:032x}", value="\u00e9" * 2048) for i in range(32)]
    message = control.parse_message(_secrets_line(*entries))
    assert isinstance(message, control.SetSecrets) and len(message.secrets) == 32


def test_a_non_ascii_value_is_sent_as_utf8_and_parsed_back() -> None:
    value = "\u20ac" * 1365  # 4095 UTF-8 bytes; as \uXXXX escapes it would take 8190
    line = control.encode({"op": "secrets", "actor": "api-key:k1", "secrets": [_entry(value=value)]})
    assert len(line) < 4096 + 512 and b"\\u20ac" not in line
    message = control.parse_message(line.rstrip(b"\n"))
    assert isinstance(message, control.SetSecrets) and message.secrets[0].value == value.encode()


class _TrickleSocket:
    """A proxy that answers a byte at a time, each just inside the socket's own timeout (the clock
    moved on by the fake, never slept): a per-receive timeout would wait for all of it."""

    def __init__(self, answer: bytes, clock: list[float]) -> None:
        self._answer = answer
        self._clock = clock
        self.timeouts: list[float | None] = []

    def __enter__(self) -> _TrickleSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sendall(self, data: bytes) -> None:
        return None

    def settimeout(self, value: float | None) -> None:
        self.timeouts.append(value)

    def recv(self, size: int) -> bytes:
        self._clock[0] += 0.9
        byte, self._answer = self._answer[:1], self._answer[1:]
        return byte


def test_a_blocking_call_is_bounded_as_a_whole_not_by_each_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    trickle = _TrickleSocket(b'{"ok":true,"role":"gateway"}\n{"ok":true,"generation":2}\n', clock)
    monkeypatch.setattr(control.socket, "create_connection", lambda *args, **kwargs: trickle)
    monkeypatch.setattr(control.time, "monotonic", lambda: clock[0])
    with pytest.raises(ControlError, match="not reachable"):
        control.call_blocking("127.0.0.1", 1, "token", control.Status(), timeout_s=2.0)
    assert clock[0] <= 3.0


def test_a_blocking_call_reads_both_lines_of_a_prompt_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    trickle = _TrickleSocket(b'{"ok":true,"role":"gateway"}\n{"ok":true,"generation":2}\n', clock)
    monkeypatch.setattr(control.socket, "create_connection", lambda *args, **kwargs: trickle)
    monkeypatch.setattr(control.time, "monotonic", lambda: 0.0)  # every byte in time
    assert control.call_blocking("127.0.0.1", 1, "token", control.Status()).to_json() == {"ok": True, "generation": 2}
