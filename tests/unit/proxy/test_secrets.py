"""The brokered secrets' pure engine (corral.proxy.secrets): the forms a value is found in, the
scrubbing of answers, the live set's changes and its metadata on disk (never a value)."""

from __future__ import annotations

import base64
import gzip
import json
import stat
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

import pytest

from corral.errors import DecodedTooLarge, InvalidMessage
from corral.proxy.secrets import (
    SECRETS_FILE,
    Scrubber,
    Secret,
    SecretBook,
    anchor_of,
    basic_credentials,
    basic_header,
    body_type,
    clean_path,
    decoded,
    encoded_for,
    path_problem,
    placeholders_in,
    secret_from,
    value_forms,
    without_placeholders,
)

VALUE = b'p@ss/w rd+&="x\xc3\xa9'  # every character an encoding changes
PH = "corral_secret_" + "1" * 32
OTHER_PH = "corral_secret_" + "2" * 32


def _secret(value: bytes | None = VALUE, name: str = "TOKEN", placeholder: str = PH, **kw: object) -> Secret:
    allow = kw.get("allow", ["GET,POST api.example.test/v1/"])
    where = kw.get("where", ["header", "body"])
    return secret_from(name, placeholder, value, allow, where)  # type: ignore[arg-type]


def _encodings(value: bytes) -> list[bytes]:
    text = value.decode()
    return [
        value,
        urllib.parse.quote(value, safe="").encode(),
        urllib.parse.quote_plus(value).encode(),
        json.dumps(text)[1:-1].encode(),
        base64.b64encode(value),
        base64.urlsafe_b64encode(value),
    ]


def test_a_secret_never_shows_its_value_in_its_repr() -> None:
    assert VALUE.decode() not in repr(_secret()) and repr(VALUE) not in repr(_secret())


def test_bindings_match_host_port_method_and_normalised_path() -> None:
    secret = _secret()
    assert secret.binds("api.example.test", 443, "POST", "/v1/repos")
    assert not secret.binds("api.example.test", 443, "DELETE", "/v1/repos")
    assert not secret.binds("api.example.test", 443, "GET", "/v2/")
    assert not secret.binds("evil.test", 443, "GET", "/v1/")
    assert not secret.binds("api.example.test", 8443, "GET", "/v1/")
    assert clean_path("/v1/../v2/x?q=1") == "/v2/x" and clean_path("/a%2fb") is None
    assert secret.bindings() == {"allow": ["GET,POST api.example.test/v1/"], "in": ["header", "body"]}


@pytest.mark.parametrize("offset", [0, 1, 2])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_value_inside_longer_base64_is_found_at_each_alignment(offset: int, encode: object) -> None:
    scrubber = Scrubber([_secret()])
    text = encode(b"u" * offset + b":" + VALUE + b" and more after")  # type: ignore[operator]
    assert scrubber.first(text) is not None
    clean, counts = scrubber.scrub(text)
    assert counts == {"TOKEN": 1} and PH.encode() in clean


@pytest.mark.parametrize("form", range(6))
def test_each_encoding_of_a_value_is_scrubbed_to_the_placeholder(form: int) -> None:
    encoded = _encodings(VALUE)[form]
    clean, counts = Scrubber([_secret()]).scrub(b"<title>" + encoded + b"</title>" + encoded)
    assert counts == {"TOKEN": 2}
    for each in _encodings(VALUE):
        assert each not in clean
    assert clean.count(PH.encode()) == 2


def test_html_escaped_and_slash_escaped_json_are_forms_too() -> None:
    forms = value_forms(b'a<b>&"c/d12')
    assert b"a&lt;b&gt;&amp;&quot;c/d12" in forms and b'a<b>&\\"c\\/d12' in forms


def test_nothing_to_scrub_leaves_the_data_and_no_value_leaves_no_forms() -> None:
    scrubber = Scrubber([_secret()])
    assert scrubber.scrub(b"plain page") == (b"plain page", {})
    assert not Scrubber([_secret(None)])


def test_placeholders_are_found_once_each_and_cut_out() -> None:
    data = f"a={PH}&b={PH}&c={OTHER_PH}".encode()
    assert placeholders_in(data) == [PH.encode(), OTHER_PH.encode()]
    assert without_placeholders(data) == b"a=&b=&c="


def test_body_types_and_how_a_value_is_written_in_each_place() -> None:
    assert [body_type(t) for t in ("application/x-www-form-urlencoded; charset=utf-8", "application/vnd.x+json")] == [
        "form",
        "json",
    ]
    assert [
        body_type(t) for t in ("multipart/form-data; boundary=x", "text/plain", "application/octet-stream", "")
    ] == [
        "multipart",
        "text",
        None,
        None,
    ]
    assert encoded_for(VALUE, "query") == urllib.parse.quote(VALUE, safe="").encode()
    assert encoded_for(VALUE, "body", "form") == urllib.parse.quote_plus(VALUE).encode()
    assert json.loads(b'"' + encoded_for(VALUE, "body", "json") + b'"') == VALUE.decode()
    assert encoded_for(VALUE, "body", "multipart") == encoded_for(VALUE, "header") == VALUE


def test_basic_credentials_round_trip() -> None:
    header = basic_header(b"user:" + PH.encode())
    assert basic_credentials(header) == b"user:" + PH.encode()
    assert basic_credentials(b"Bearer abc") is None and basic_credentials(b"Basic !!!") is None


def test_secret_from_refuses_bad_names_placeholders_locations_and_rules() -> None:
    with pytest.raises(ValueError, match="reserved"):
        _secret(name="PATH")
    with pytest.raises(ValueError, match="placeholder"):
        _secret(placeholder="corral_secret_XYZ")
    with pytest.raises(ValueError, match="'in'"):
        _secret(where=["cookie"])
    with pytest.raises(ValueError, match="wildcard"):
        _secret(allow=["a*.test"])


def test_plan_names_what_changes_and_apply_makes_it_so() -> None:
    book = SecretBook()
    assert not book.active and book.state() == {"generation": 0, "names": [], "loaded": True}
    first = book.plan([_secret(), _secret(b"other-value", "OLD", OTHER_PH)])
    assert (first.added, first.rotated, first.revoked, first.restored) == (["TOKEN", "OLD"], [], [], [])
    assert book.secrets == {}  # a plan changes nothing
    book.apply(first)
    assert book.active and book.state() == {"generation": 1, "names": ["OLD", "TOKEN"], "loaded": True}
    second = book.plan([_secret(b"rotated-value")])
    assert (second.added, second.rotated, second.revoked, second.restored) == ([], ["TOKEN"], ["OLD"], [])
    book.apply(second)
    assert book.revoked == {OTHER_PH: "OLD"} and OTHER_PH.encode() in book.revoked_bytes
    assert book.scrubber.first(b"xx rotated-value xx") is not None
    assert book.secrets["TOKEN"].value == b"rotated-value"  # the old value is retired, not live
    # Sent without a value: the one held stays.
    book.apply(book.plan([_secret(None, allow=["api.example.test"])]))
    assert book.secrets["TOKEN"].value == b"rotated-value" and book.generation == 3


def test_values_no_longer_live_are_still_scrubbed_as_their_secret_for_the_book_s_life(tmp_path: Path) -> None:
    book = SecretBook()
    book.apply(book.plan([_secret(), _secret(b"other-value", "OLD", OTHER_PH)]))
    change = book.plan([_secret(b"rotated-value")])  # TOKEN rotated, OLD revoked
    book.apply(change)
    assert set(book.retired) == {VALUE, b"other-value"}
    clean, counts = book.scrubber.scrub(b"a " + VALUE + b" b other-value c rotated-value")
    assert clean == f"a {PH} b {OTHER_PH} c {PH}".encode() and counts == {"TOKEN": 2, "OLD": 1}
    found = book.scrubber.first(b"x " + urllib.parse.quote(b"other-value").encode())
    assert found is not None and (found.name, found.placeholder) == ("OLD", OTHER_PH)
    book.apply(book.plan([_secret()]))  # rotated back: the live value, still scrubbed as TOKEN
    assert book.secrets["TOKEN"].value == VALUE and b"rotated-value" in book.retired
    assert book.scrubber.scrub(b"rotated-value " + VALUE)[0] == f"{PH} {PH}".encode()
    path = tmp_path / "secrets.json"
    book.persist(path, change)
    assert all(value not in path.read_bytes() for value in (VALUE, b"other-value", b"rotated-value"))
    again = SecretBook()
    assert again.restore(path) and not again.retired and again.scrubber.first(b"other-value") is None


def test_a_name_keeps_its_placeholder_and_a_revoked_one_never_returns() -> None:
    book = SecretBook()
    book.apply(book.plan([_secret(), _secret(b"other-value", "OLD", OTHER_PH)]))
    with pytest.raises(InvalidMessage, match="may not change") as changed:
        book.plan([_secret(placeholder="corral_secret_" + "3" * 32)])
    assert changed.value.field == "secrets.TOKEN.placeholder"
    book.apply(book.plan([_secret()]))
    with pytest.raises(InvalidMessage, match="revoked"):
        book.plan([_secret(), _secret(b"other-value", "NEW", OTHER_PH)])


def test_metadata_is_persisted_without_values_and_restored_unloaded(tmp_path: Path) -> None:
    book = SecretBook()
    book.apply(book.plan([_secret(), _secret(b"other-value", "OLD", OTHER_PH)]))
    change = book.plan([_secret()])
    path = tmp_path / SECRETS_FILE
    book.persist(path, change)
    book.apply(change)
    raw = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for encoded in _encodings(VALUE) + _encodings(b"other-value"):
        assert encoded not in raw
    restarted = SecretBook()
    assert restarted.restore(path)
    assert restarted.state() == {"generation": 2, "names": ["TOKEN"], "loaded": False}
    assert restarted.secrets["TOKEN"].bindings() == book.secrets["TOKEN"].bindings()
    assert restarted.revoked == {OTHER_PH: "OLD"} and restarted.active and not restarted.scrubber
    again = restarted.plan([_secret()])
    assert again.restored == ["TOKEN"] and again.added == again.rotated == []
    assert not SecretBook().restore(tmp_path / "none.json")


# -- after the review ----------------------------------------------------------------------------

TOKEN_LIKE = b"ghp_Abcdefghijklmnopqrstuvwxyz0123456789"


def test_a_bound_path_prefix_covers_whole_segments_only() -> None:
    secret = _secret(allow=["api.example.test/v1"])
    assert secret.binds("api.example.test", 443, "GET", "/v1")
    assert secret.binds("api.example.test", 443, "GET", "/v1/repos")
    assert not secret.binds("api.example.test", 443, "GET", "/v1admin")
    assert not secret.binds("api.example.test", 443, "GET", "/v1.json")
    assert _secret(allow=["api.example.test/v1/"]).binds("api.example.test", 443, "GET", "/v1/x")


@pytest.mark.parametrize(
    ("target", "words"),
    [
        (b"/v1//..//admin", "empty segment"),
        (b"/v1/#/../../admin", "'#'"),
        (b"/v1/..;/admin", "';'"),
        (b"/v1/%2e%2E/admin", "dot segment"),
        (b"/v1/%2E/admin", "dot segment"),
        (b"/v1/./admin", "dot segment"),
        (b"/v1\\..\\admin", "backslash"),
        (b"/v1/%5C../admin", "backslash"),
        (b"/v1/a%2Fb", "encoded slash"),
        (b"v1/x", "start with"),
    ],
)
def test_a_target_servers_may_read_otherwise_is_not_canonical(target: bytes, words: str) -> None:
    problem = path_problem(target)
    assert problem is not None and words in problem


@pytest.mark.parametrize("target", [b"/", b"/v1/", b"/v1/repos?a=//..;x#", b"/v1/a.b/..c/%2e1"])
def test_a_canonical_target_has_no_problem(target: bytes) -> None:
    if b"#" in target:
        assert path_problem(target) == "its URL holds a '#'"
    else:
        assert path_problem(target) is None


def _wrapped_base64(value: bytes, width: int, line_break: bytes) -> bytes:
    text = base64.b64encode(b"x" * 20 + value + b"y" * 40)
    return line_break.join(text[i : i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize(
    "reflected",
    [
        _wrapped_base64(TOKEN_LIKE, 60, b"\n"),
        _wrapped_base64(TOKEN_LIKE, 76, b"\r\n"),
        _wrapped_base64(TOKEN_LIKE, 60, b"\\n"),  # GitHub's contents API: JSON-escaped line breaks
        TOKEN_LIKE.hex().encode(),
        TOKEN_LIKE.hex().upper().encode(),
        TOKEN_LIKE.upper(),
        TOKEN_LIKE.lower(),
    ],
)
def test_wrapped_base64_hex_and_other_letter_case_are_scrubbed(reflected: bytes) -> None:
    scrubber = Scrubber([_secret(TOKEN_LIKE)])
    page = b"<pre>" + reflected + b"</pre>"
    assert scrubber.first(page) is not None
    clean, counts = scrubber.scrub(page)
    assert counts == {"TOKEN": 1} and clean.startswith(b"<pre>") and clean.endswith(b"</pre>")
    assert TOKEN_LIKE.lower() not in clean.lower() and TOKEN_LIKE.hex().encode() not in clean.lower()


@pytest.mark.parametrize(
    "reflected",
    [
        b"pa\\u0026ss\\u003cword\\u003e'x",  # Go's encoding/json
        b"pa\\u0026ss\\u003Cword\\u003E\\u0027x",
        b"pa&amp;ss&lt;word&gt;&#39;x",  # Jinja, ERB
        b"pa&amp;ss&lt;word&gt;&#039;x",  # PHP
        b"pa&#38;ss&#60;word&#62;&#39;x",
        b"pa&#x26;ss&#x3C;word&#x3e;&#x27;x",
        b"pa%26ss%3cword%3e%27x",  # lowercase percent hex
    ],
)
def test_go_json_numeric_entities_and_lowercase_percent_hex_are_scrubbed(reflected: bytes) -> None:
    scrubber = Scrubber([_secret(b"pa&ss<word>'x")])
    clean, counts = scrubber.scrub(b"[" + reflected + b"]")
    assert counts == {"TOKEN": 1} and clean == b"[" + PH.encode() + b"]"


_SPELLED = b"pa&ss<word>'x!(y)*"


@pytest.mark.parametrize(
    ("reflected", "name"),
    [
        ("".join(f"&#{b};" for b in _SPELLED).encode(), "every character a decimal reference"),
        ("".join(f"&#x{b:X};" for b in _SPELLED).encode(), "every character a hex reference"),
        ("".join(f"\\u{b:04x}" for b in _SPELLED).encode(), "every character a JSON escape"),
        (urllib.parse.quote(_SPELLED, safe="!'()*").encode(), "encodeURIComponent"),
    ],
)
def test_a_value_spelled_out_in_escapes_or_by_encodeuricomponent_is_scrubbed(reflected: bytes, name: str) -> None:
    scrubber = Scrubber([_secret(_SPELLED)])
    data = b'{"t": "' + reflected + b'", "u": "&#97;&#98;&#99;&#100;&#101;&#102;&#103;&#104;"}'
    assert scrubber.first(data) is not None, name
    clean, counts = scrubber.scrub(data)
    assert counts == {"TOKEN": 1}, name
    assert reflected not in clean and b"&#97;&#98;&#99;&#100;&#101;&#102;&#103;&#104;" in clean  # the rest as it was
    assert scrubber.first(clean) is None


def test_a_value_without_a_long_alphanumeric_run_is_still_found_in_every_form() -> None:
    scrubber = Scrubber([_secret(b"a&b<c>d'e")])
    assert anchor_of(b"a&b<c>d'e") is None and anchor_of(TOKEN_LIKE) == TOKEN_LIKE.lower()[4:]
    assert scrubber.first(b"a&amp;b&lt;c&gt;d&#39;e") is not None


def test_a_placeholder_belongs_to_one_name() -> None:
    book = SecretBook()
    book.apply(book.plan([_secret()]))
    with pytest.raises(InvalidMessage, match="TOKEN's") as taken:  # revoked and reused in one message
        book.plan([_secret(b"value-of-b-1", "B")])
    assert taken.value.field == "secrets.B.placeholder"
    with pytest.raises(InvalidMessage, match="TOKEN's"):  # held by a live name
        book.plan([_secret(), _secret(b"value-of-b-1", "B")])
    with pytest.raises(InvalidMessage, match="too in this message") as twice:
        SecretBook().plan([_secret(), _secret(b"value-of-b-1", "B")][::-1])
    assert twice.value.field in ("secrets.B.placeholder", "secrets.TOKEN.placeholder")
    assert book.plan([_secret()]).generation == 2  # the set itself still goes


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decoding_is_bounded(encoding: str) -> None:
    body = b"0123456789" * 1000
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    assert decoded(packed, encoding) == body
    with pytest.raises(DecodedTooLarge):
        decoded(packed, encoding, cap=len(body) - 1)
    with pytest.raises(ValueError):  # truncated
        decoded(packed[: len(packed) // 2], encoding)
    assert decoded(zlib.compress(body)[2:-4], "deflate") == body  # raw deflate, as some servers send it
    with pytest.raises(ValueError, match="unknown"):
        decoded(body, "compress")
    with pytest.raises(DecodedTooLarge):
        decoded(body, "identity", cap=10)


def test_brotli_and_zstd_decoding_is_bounded() -> None:
    brotli = pytest.importorskip("brotli")
    zstandard = pytest.importorskip("zstandard")
    body = bytes(1024 * 1024)
    for packed, encoding in ((brotli.compress(body), "br"), (zstandard.ZstdCompressor().compress(body), "zstd")):
        assert decoded(packed, encoding) == body
        with pytest.raises(DecodedTooLarge):
            decoded(packed, encoding, cap=1000)
        with pytest.raises(ValueError):
            decoded(b"\xff" * 64, encoding)


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def test_every_gzip_member_and_every_deflate_stream_is_decoded() -> None:
    assert decoded(gzip.compress(b"one;") + gzip.compress(b"") + gzip.compress(b"two"), "gzip") == b"one;two"
    assert decoded(zlib.compress(b"one;") + zlib.compress(b"two"), "deflate") == b"one;two"
    assert decoded(zlib.compress(b"one;") + _raw_deflate(b"two"), "deflate") == b"one;two"
    assert decoded(_raw_deflate(b"one;") + zlib.compress(b"two"), "deflate") == b"one;two"
    # The cap holds over every member together.
    members = gzip.compress(bytes(600)) * 2
    assert len(decoded(members, "gzip", cap=1200)) == 1200
    with pytest.raises(DecodedTooLarge):
        decoded(members, "gzip", cap=1199)


@pytest.mark.parametrize("tail", [b"garbage", b"\x1f\x8b\x08\x00", gzip.compress(b"cut", mtime=0)[:-3]])
def test_bytes_after_the_last_member_that_are_no_member_cannot_be_decoded(tail: bytes) -> None:
    with pytest.raises(ValueError):
        decoded(gzip.compress(b"one") + tail, "gzip")


_PARTIAL = TOKEN_LIKE  # letters, digits and '-': escapes change some of them


@pytest.mark.parametrize(
    ("escaped", "name"),
    [
        (lambda c, i: f"\\u{c:04x}" if i % 3 == 0 else chr(c), "some characters JSON-escaped"),
        (lambda c, i: f"&#{c};" if i % 4 == 0 else f"&#x{c:X};" if i % 4 == 1 else chr(c), "some references"),
        (lambda c, i: "&lowbar;" if c == 0x5F else f"&#{c}" if i == 9 else chr(c), "a named entity"),
        (lambda c, i: f"%{c:02x}" if i % 2 else chr(c), "some percent-escaped"),
        (lambda c, i: (f"%{c:02X}", f"\\u{c:04X}", f"&#{c};", chr(c))[i % 4], "three kinds mixed"),
        (lambda c, i: f"&amp;#{c};" if i % 2 else chr(c), "an escape of an escape"),
    ],
)
def test_a_value_with_some_characters_escaped_is_found_and_scrubbed(escaped: Any, name: str) -> None:
    reflected = "".join(escaped(c, i) for i, c in enumerate(_PARTIAL)).encode()
    scrubber = Scrubber([_secret(_PARTIAL)])
    data = b'<p title="a &amp; b">%20 ' + reflected + b" \\u00e9</p>"
    assert scrubber.first(data) is not None, name
    clean, counts = scrubber.scrub(data)
    assert counts == {"TOKEN": 1}, (name, clean)
    assert clean == b'<p title="a &amp; b">%20 ' + PH.encode() + b" \\u00e9</p>", name  # the rest as it was
    assert scrubber.first(clean) is None


def test_base64_with_its_signs_percent_escaped_is_scrubbed() -> None:
    value = b"\xfb\xff\xfe-value-with-signs\xfb\xef\xbe"
    encoded = base64.b64encode(value)
    assert b"+" in encoded or b"/" in encoded
    reflected = urllib.parse.quote(encoded, safe="").encode()
    scrubber = Scrubber([_secret(value)])
    clean, counts = scrubber.scrub(b"?sig=" + reflected + b"&x=1")
    # The characters base64 writes from the value's bytes alone go; its last (with the padding) may stay.
    assert counts == {"TOKEN": 1} and clean.startswith(b"?sig=" + PH.encode()) and len(clean) < 70, clean
    assert scrubber.first(clean) is None


def test_escapes_that_spell_no_value_are_left_as_they_were() -> None:
    scrubber = Scrubber([_secret(_PARTIAL)])
    page = b"&lt;b&gt; caf&eacute; %41%42 \\u0041 &#65; " * 1000
    assert scrubber.first(page) is None
    assert scrubber.scrub(page) == (page, {})
