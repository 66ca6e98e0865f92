"""The scrubber's canonical pass (corral.proxy.unescape): escapes decoded as a reader shows them, and
spans of the decoded text mapped back to the original bytes they came from."""

from __future__ import annotations

import json

import pytest

from corral.proxy import unescape
from corral.proxy.unescape import CHUNK, Decoder, decode_token, find_all, original_span


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        (b"%41", b"A"),
        (b"%c3", b"\xc3"),
        (b"\\u0041", b"A"),
        (b"\\u00e9", "é".encode()),
        (b"\\ud83d\\ude00", "😀".encode()),
        (b"\\ud83d", "\ufffd".encode()),  # a lone surrogate
        (b'\\"', b'"'),
        (b"\\/", b"/"),
        (b"&#65;", b"A"),
        (b"&#65", b"A"),  # browsers decode a reference without its ';'
        (b"&#x41;", b"A"),
        (b"&#000000000000065;", b"A"),  # leading zeros pad nothing away
        (b"&#128;", "€".encode()),  # windows-1252, as browsers read it
        (b"&#0;", "\ufffd".encode()),
        (b"&excl;", b"!"),
        (b"&amp", b"&"),  # a legacy name without its ';'
        (b"&unknownname;", b"&unknownname;"),
    ],
)
def test_each_escape_decodes_as_its_reader_shows_it(token: bytes, shown: bytes) -> None:
    assert decode_token(token) == shown
    assert len(shown) <= len(token)  # decoding never lengthens a text


def _decoded(data: bytes) -> list[bytes]:
    return [layer.text for layer in Decoder().layers(data)]


def test_every_kind_is_decoded_in_one_pass_and_an_escape_of_an_escape_in_two() -> None:
    assert _decoded(b"%53k\\u005f&#108;ive&excl;") == [b"Sk_live!"]
    assert _decoded(b"&amp;#83;k %2541") == [b"&#83;k %41", b"Sk A"]
    assert _decoded(b"no escape here") == []
    assert _decoded(b"100% & more") == []  # leads that start no escape change nothing


def test_json_escapes_are_read_left_to_right_as_a_parser_reads_them() -> None:
    raw = b'a\\\\u0041b \\"q\\"'
    assert json.loads(b'"' + raw + b'"').encode() == _decoded(raw)[0] == b'a\\u0041b "q"'


def _span_of(data: bytes, value: bytes) -> tuple[int, int]:
    layers = Decoder().layers(data)
    depth = len(layers) - 1
    ((start, end),) = list(find_all(layers[depth].text, value))
    return original_span(layers, depth, start, end)


def test_a_span_maps_back_to_the_original_bytes_widened_to_whole_escapes() -> None:
    data = b"before %53k_l&#105;ve\\u0021 after"
    start, end = _span_of(data, b"Sk_live!")
    assert data[start:end] == b"%53k_l&#105;ve\\u0021"
    start, end = _span_of(data, b"k_li")  # from inside a plain run into an escape
    assert data[start:end] == b"k_l&#105;"
    start, end = _span_of(b"x&NotEqualTilde;y", b"\xcc\xb8")  # the second of an entity's two characters
    assert (start, end) == (1, 16)


def test_a_span_maps_back_across_pieces_and_layers() -> None:
    value = b"Sk_live/9f3c+A1b!x"
    escaped = b"".join(b"&amp;#%d;" % c if i % 2 else bytes([c]) for i, c in enumerate(value))
    for filler in (b"&lt;p&gt; %20 ", b"%41" * 5, b"x" * 7):  # pieces cut at safe bytes, or by reading escapes
        for offset in range(-40, 40, 7):
            head = filler * ((CHUNK + offset) // len(filler))
            data = head + escaped + filler * 100
            start, end = _span_of(data, value)
            assert data[start:end] == escaped, (filler, offset)


def test_a_long_run_without_a_safe_byte_is_cut_where_an_escape_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unescape, "CHUNK", 64)
    data = b"\\u0041" * 100 + b"\\u0042" + b"\\u0041" * 100
    pieces = list(unescape._pieces(data))
    assert len(pieces) > 5 and all((start - 0) % 6 == 0 for start, _ in pieces)
    assert _span_of(data, b"B") == (600, 606)
