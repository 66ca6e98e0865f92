"""The Jupyter wire protocol, both ways: what the controller signs, and what a hostile kernel may send."""

from __future__ import annotations

import json

import pytest

from corral.errors import BadKernelMessage
from corral.sandbox.kernels import wire

KEY = b"0123abcd" * 8


def frames(
    msg_type: str = "stream", parent: str | None = "p1", content: object = None, key: bytes = KEY
) -> list[bytes]:
    header = json.dumps({"msg_id": "m1", "msg_type": msg_type}).encode()
    parent_header = json.dumps({"msg_id": parent} if parent else {}).encode()
    body = json.dumps({"name": "stdout", "text": "hi"} if content is None else content).encode()
    parts = [header, parent_header, b"{}", body]
    return [b"topic", wire.DELIMITER, wire.sign(KEY if key is KEY else key, parts), *parts]


def test_a_request_is_signed_over_its_four_parts_and_reads_back() -> None:
    msg_id, sent = wire.request(KEY, "s1", "execute_request", {"code": "1"})
    assert sent[0] == wire.DELIMITER and sent[1] == wire.sign(KEY, sent[2:])
    header = json.loads(sent[2])
    assert (header["msg_id"], header["msg_type"], header["session"], header["version"]) == (
        msg_id,
        "execute_request",
        "s1",
        "5.3",
    )
    read = wire.parse(KEY, sent)
    assert (read.msg_type, read.msg_id, read.parent_id, read.content) == (
        "execute_request",
        msg_id,
        None,
        {"code": "1"},
    )


def test_a_kernels_message_is_read_with_its_parent() -> None:
    message = wire.parse(KEY, frames())
    assert (message.msg_type, message.parent_id, message.content) == ("stream", "p1", {"name": "stdout", "text": "hi"})


def test_a_message_signed_with_another_key_is_refused() -> None:
    with pytest.raises(BadKernelMessage, match="signature"):
        wire.parse(KEY, frames(key=b"another key"))


def test_a_tampered_part_fails_its_signature() -> None:
    sent = frames()
    sent[-1] = b'{"name": "stdout", "text": "forged"}'
    with pytest.raises(BadKernelMessage, match="signature"):
        wire.parse(KEY, sent)


@pytest.mark.parametrize(
    ("sent", "why"),
    [
        ([b"x"] * (wire.MAX_PARTS + 1), "parts"),
        ([b"topic", wire.DELIMITER, b"sig", b"x" * (wire.MAX_MESSAGE_BYTES + 1), b"{}", b"{}", b"{}"], "bytes"),
        ([b"topic", b"{}", b"{}"], "delimiter"),
        ([*[b"id"] * (wire.MAX_PREFIX_PARTS + 1), wire.DELIMITER, b"s", b"{}", b"{}", b"{}", b"{}"], "delimiter"),
        ([wire.DELIMITER, b"sig", b"{}"], "four JSON parts"),
    ],
)
def test_malformed_frames_are_refused_before_any_parsing(sent: list[bytes], why: str) -> None:
    with pytest.raises(BadKernelMessage, match=why):
        wire.parse(KEY, sent)


@pytest.mark.parametrize("content", [[1, 2], "text", None])
def test_a_part_that_is_not_an_object_is_refused(content: object) -> None:
    parts = [b'{"msg_id": "m", "msg_type": "stream"}', b"{}", b"{}", json.dumps(content).encode()]
    with pytest.raises(BadKernelMessage, match="object"):
        wire.parse(KEY, [wire.DELIMITER, wire.sign(KEY, parts), *parts])


def test_deeply_nested_json_is_refused_not_a_crash() -> None:
    parts = [b'{"msg_id": "m", "msg_type": "stream"}', b"{}", b"{}", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"]
    with pytest.raises(BadKernelMessage):
        wire.parse(KEY, [wire.DELIMITER, wire.sign(KEY, parts), *parts])


def test_a_header_without_type_or_id_is_refused() -> None:
    parts = [b'{"msg_type": 3}', b"{}", b"{}", b"{}"]
    with pytest.raises(BadKernelMessage, match="header"):
        wire.parse(KEY, [wire.DELIMITER, wire.sign(KEY, parts), *parts])


def test_a_parent_id_that_is_not_a_string_is_no_parent() -> None:
    parts = [b'{"msg_id": "m", "msg_type": "status"}', b'{"msg_id": 5}', b"{}", b"{}"]
    assert wire.parse(KEY, [wire.DELIMITER, wire.sign(KEY, parts), *parts]).parent_id is None


def test_keys_are_new_each_time() -> None:
    assert wire.new_key() != wire.new_key() and len(wire.new_key()) == 64
