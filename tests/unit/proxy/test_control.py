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
            await control.call("127.0.0.1", port, "token", {"op": "policy", "allow": [], "mode": "off"})
    assert isinstance(refused.value, CorralError) and refused.value.code == "invalid_field"
    async with await _proxy_answering({"ok": False, "error": "unknown token"}) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ControlError, match="unknown token") as stranger:
            await control.call("127.0.0.1", port, "guess", {"op": "status"})
    assert stranger.value.code == control.EGRESS_UNAVAILABLE
    async with await _proxy_answering(hello, {"ok": True, "generation": 2}) as server:
        port = server.sockets[0].getsockname()[1]
        assert await control.call("127.0.0.1", port, "token", {"op": "status"}) == {"ok": True, "generation": 2}


async def test_an_unreachable_proxy_is_a_control_error_with_a_stable_code() -> None:
    async with await _proxy_answering() as server:
        port = server.sockets[0].getsockname()[1]
    # The port is closed now: nobody answers there.
    with pytest.raises(ControlError, match="not reachable") as gone:
        await control.call("127.0.0.1", port, "token", {"op": "status"})
    assert isinstance(gone.value, CorralError) and gone.value.code == "egress_unavailable"
    with pytest.raises(ControlError, match="not reachable") as gone_too:
        control.call_blocking("127.0.0.1", port, "token", {"op": "status"})
    assert gone_too.value.code == "egress_unavailable"
