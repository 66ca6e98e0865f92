from __future__ import annotations

import pytest

from corral.proxy.hosts import canonical_or_raw, normalize_host, parse_authority, parse_ip


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("  api.example.test ", "api.example.test"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("XN--BCHER-KVA.DE", "xn--bcher-kva.de"),
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # one decimal number
        ("0x7f000001", "127.0.0.1"),  # hex
        ("0177.0.0.1", "127.0.0.1"),  # octal part
        ("0x7f.1", "127.0.0.1"),  # two parts, hex
        ("127.1", "127.0.0.1"),  # short form
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),  # the metadata address, spelled in hex
        ("[::1]", "::1"),
        ("::FFFF:127.0.0.1", "127.0.0.1"),  # IPv4-mapped IPv6 is the IPv4 address
        ("0:0:0:0:0:0:0:1", "::1"),
        ("1e100.net", "1e100.net"),
        ("0.face", "0.face"),
    ],
)
def test_one_canonical_form(raw: str, canonical: str) -> None:
    assert normalize_host(raw) == canonical


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        "a..b",
        "-bad.com",
        "bad-.com",
        "exa mple.com",
        "x" * 64 + ".com",
        "1.2.3.4.5",
        "256.256.256.256.1",
        "[fe80::1%eth0]",
        "[::g]",
        "under_score.com",
    ],
)
def test_invalid_hosts_raise_value_error(raw: str) -> None:
    with pytest.raises(ValueError):
        normalize_host(raw)


def test_parse_ip_tells_names_from_addresses() -> None:
    assert parse_ip("example.com") is None
    assert str(parse_ip("10.1")) == "10.0.0.1"
    assert str(parse_ip("[2001:db8::1]")) == "2001:db8::1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.test", ("a.test", 443)),
        ("A.Test.:8443", ("a.test", 8443)),
        ("[::1]:80", ("::1", 80)),
        ("[2001:db8::1]", ("2001:db8::1", 443)),
    ],
)
def test_parse_authority(text: str, expected: tuple[str, int]) -> None:
    assert parse_authority(text, 443) == expected


@pytest.mark.parametrize("text", ["a.test:x", "[::1", "a.test:70000", "[::1]x"])
def test_parse_authority_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_authority(text, 443)


def test_canonical_or_raw_keeps_what_has_no_canonical_form() -> None:
    assert canonical_or_raw("Allowed.Test.") == "allowed.test"
    assert canonical_or_raw("bad host!") == "bad host!"  # the policy refuses it as invalid-host
