"""The brokered secrets' pure engine (corral.proxy.secrets): the forms a value is found in, the
scrubbing of answers, the live set's changes and its metadata on disk (never a value)."""

from __future__ import annotations

import base64
import json
import stat
import urllib.parse
from pathlib import Path

import pytest

from corral.errors import InvalidMessage
from corral.proxy.secrets import (
    SECRETS_FILE,
    Scrubber,
    Secret,
    SecretBook,
    basic_credentials,
    basic_header,
    body_type,
    clean_path,
    encoded_for,
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
    assert book.scrubber.first(b"xx rotated-value xx") is not None and book.scrubber.first(VALUE) is None
    # Sent without a value: the one held stays.
    book.apply(book.plan([_secret(None, allow=["api.example.test"])]))
    assert book.secrets["TOKEN"].value == b"rotated-value" and book.generation == 3


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
