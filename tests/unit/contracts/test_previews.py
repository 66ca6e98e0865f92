"""Port previews' shared names (corral.contracts.previews): the host form and its parser, the
cookie names, the ports no preview may reach."""

from __future__ import annotations

import pytest

from corral.contracts.previews import (
    RESERVED_PORTS,
    PreviewHost,
    cookie_name,
    host_name,
    parse_host,
    port_problem,
    preview_id_of_cookie,
)


def test_a_host_name_is_port_dash_session_hex_under_the_domain() -> None:
    assert host_name(3000, "ses_0123abcd", "localhost") == "3000-0123abcd.localhost"
    with pytest.raises(ValueError, match="not a session id"):
        host_name(3000, "ses_NOT-HEX", "localhost")
    with pytest.raises(ValueError, match="not a session id"):
        host_name(3000, "0123abcd", "localhost")


@pytest.mark.parametrize(
    ("header", "found"),
    [
        ("3000-0123abcd.localhost:8701", PreviewHost(3000, "ses_0123abcd")),
        ("3000-0123abcd.localhost", PreviewHost(3000, "ses_0123abcd")),
        ("3000-0123ABCD.LOCALHOST:8701", PreviewHost(3000, "ses_0123abcd")),  # host names have no case
        ("3000-0123abcd.localhost.:8701", PreviewHost(3000, "ses_0123abcd")),  # the root's dot
        ("65535-ff.localhost", PreviewHost(65535, "ses_ff")),
        ("65536-ff.localhost", None),  # no such port
        ("0-ff.localhost", None),
        ("03000-ff.localhost", None),  # one spelling per port
        ("3000-ff.evil.localhost", None),  # deeper than a preview
        ("a.3000-ff.localhost", None),
        ("3000-ff.localhost.evil.test", None),  # another domain
        ("3000-ffxlocalhost", None),
        ("3000-ff_x.localhost", None),
        ("localhost:8701", None),
        ("127.0.0.1:8701", None),
        ("[::1]:8701", None),
        ("", None),
    ],
)
def test_parse_host_finds_only_a_preview_s_name(header: str, found: PreviewHost | None) -> None:
    assert parse_host(header, "localhost") == found


def test_another_domain_is_parsed_under_itself() -> None:
    assert parse_host("8080-abc.preview.example.test", "preview.example.test") == PreviewHost(8080, "ses_abc")
    assert parse_host("8080-abc.localhost", "preview.example.test") is None


def test_cookie_names_are_per_preview_and_read_back() -> None:
    assert cookie_name("prv_abc123") == "corral_preview_abc123"
    assert preview_id_of_cookie("corral_preview_abc123") == "prv_abc123"
    assert preview_id_of_cookie("corral_preview_") is None
    assert preview_id_of_cookie("corral_preview_a;b") is None
    assert preview_id_of_cookie("session") is None


def test_reserved_ports_and_out_of_range_ones_are_refused_with_the_reason() -> None:
    assert {8765, 9222, 8701} == RESERVED_PORTS
    for port in RESERVED_PORTS:
        assert "reserved" in (port_problem(port) or "")
    assert port_problem(0) == "port 0 is not 1..65535"
    assert port_problem(65536) == "port 65536 is not 1..65535"
    assert port_problem(3000) is None
