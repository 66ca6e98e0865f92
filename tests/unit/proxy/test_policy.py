from __future__ import annotations

import pytest

from corral.proxy.policy import Policy, parse_rule

ALLOW = ["example.test", "*.cdn.example.test", "api.example.test:8443", "GET,HEAD docs.example.test/guide/"]


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Example.Test", "example.test"),
        ("*.CDN.example.test", "*.cdn.example.test"),
        ("api.example.test:8443", "api.example.test:8443"),
        ("get,head docs.example.test/guide/", "GET,HEAD docs.example.test/guide/"),
        ("[2001:db8::5]:443", "2001:db8::5:443"),
    ],
)
def test_rules_parse_to_a_canonical_text(text: str, canonical: str) -> None:
    assert str(parse_rule(text)) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "",
        "exa*mple.test",
        "*.*.test",
        "FETCH example.test",
        "example.test:0",
        "example.test:99999",
        "example.test:http",
        "*.10.0.0.1",
        "[::1",
    ],
)
def test_bad_rules_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rule(text)


@pytest.mark.parametrize(
    ("host", "port", "allowed", "rule"),
    [
        ("example.test", 443, True, "example.test"),
        ("EXAMPLE.test.", 80, True, "example.test"),
        ("www.example.test", 443, False, "default-deny"),  # exact rule: no subdomains
        ("img.cdn.example.test", 443, True, "*.cdn.example.test"),
        ("a.b.cdn.example.test", 443, True, "*.cdn.example.test"),
        ("cdn.example.test", 443, False, "default-deny"),  # a wildcard does not cover the apex
        ("evilcdn.example.test", 443, False, "default-deny"),
        ("api.example.test", 8443, True, "api.example.test:8443"),
        ("api.example.test", 443, False, "default-deny"),
        ("other.invalid", 443, False, "default-deny"),
        ("localhost", 443, False, "global-deny"),
        ("metadata.google.internal", 80, False, "global-deny"),
        ("127.0.0.1", 80, False, "global-deny"),
        ("2130706433", 80, False, "global-deny"),
        ("0x7f.1", 80, False, "global-deny"),
        ("169.254.169.254", 80, False, "global-deny"),
        ("10.1.2.3", 80, False, "global-deny"),
        ("192.168.1.1", 80, False, "global-deny"),
        ("[::1]", 80, False, "global-deny"),
        ("::ffff:10.0.0.1", 80, False, "global-deny"),
        ("[fd00::1]", 80, False, "global-deny"),
        ("bad host", 80, False, "invalid-host"),
    ],
)
def test_connect_decisions(host: str, port: int, allowed: bool, rule: str) -> None:
    decision = Policy(ALLOW).connect(host, port)
    assert decision.allowed is allowed
    assert decision.rule == rule
    assert decision.reason


def test_global_deny_wins_over_the_allowlist_unless_the_operator_says_so() -> None:
    assert Policy(["127.0.0.1", "localhost"]).connect("127.0.0.1", 80).rule == "global-deny"
    assert Policy(["127.0.0.1"], allow_private=True).connect("127.0.0.1", 80).allowed is True


def test_methods_and_path_prefixes_apply_per_request() -> None:
    policy = Policy(ALLOW)
    assert policy.request("docs.example.test", 443, "GET", "/guide/intro").allowed is True
    assert policy.request("docs.example.test", 443, "head", "/guide/").allowed is True
    assert policy.request("docs.example.test", 443, "POST", "/guide/").allowed is False
    assert policy.request("docs.example.test", 443, "GET", "/admin").allowed is False
    assert policy.request("example.test", 443, "DELETE", "/anything").allowed is True


def test_a_name_resolving_into_the_global_deny_is_refused() -> None:
    policy = Policy(ALLOW)
    assert policy.resolved("example.test", "203.0.114.7").allowed is True
    assert policy.resolved("example.test", "10.0.0.8").rule == "global-deny"
    assert policy.resolved("example.test", "::1").rule == "global-deny"
    assert policy.resolved("example.test", "not-an-ip").allowed is False
    assert Policy(ALLOW, allow_private=True).resolved("example.test", "10.0.0.8").allowed is True


def test_deny_by_default() -> None:
    assert Policy([]).connect("example.test", 443).rule == "default-deny"


@pytest.mark.parametrize(
    "path",
    [
        "/guide/../admin",
        "/guide/%2e%2e/admin",
        "/guide/..%2fadmin",
        "/guide/%2E%2E/admin",
        "/guide/./../admin",
        "/guide/..%5cadmin",
        "/guide\\..\\admin",
    ],
)
def test_path_prefixes_cannot_be_escaped(path: str) -> None:
    policy = Policy(["GET docs.example.test/guide/"])
    assert policy.request("docs.example.test", 443, "GET", path).allowed is False


@pytest.mark.parametrize("path", ["/guide/intro", "/guide/./intro", "/guide/a/../b", "/guide/%41", "/guide/?q=../x"])
def test_path_normalisation_keeps_what_is_inside(path: str) -> None:
    assert Policy(["GET docs.example.test/guide/"]).request("docs.example.test", 443, "GET", path).allowed is True


@pytest.mark.parametrize(
    "address", ["fec0::1", "::ffff:0:1", "64:ff9b:1::1", "2002:7f00:1::", "2002:a00:1::1", "::1.2.3.4", "100.64.0.1"]
)
def test_special_ipv6_and_shared_addresses_are_denied(address: str) -> None:
    assert Policy(["example.test"]).resolved("example.test", address).rule == "global-deny"


def test_a_rule_without_a_port_allows_the_web_ports_only() -> None:
    policy = Policy(["example.test"])
    assert policy.connect("example.test", 443).allowed and policy.connect("example.test", 80).allowed
    assert not policy.connect("example.test", 22).allowed
    assert Policy(["example.test:22"]).connect("example.test", 22).allowed


def test_allow_private_lifts_addresses_but_not_local_names_or_doh() -> None:
    policy = Policy(["10.1.2.3", "metadata.google.internal", "dns.google"], allow_private=True)
    assert policy.connect("10.1.2.3", 443).allowed
    assert policy.connect("metadata.google.internal", 80).rule == "global-deny"
    assert policy.connect("dns.google", 443).rule == "global-deny"


def test_refusal_reasons_hold_the_normalised_path_only() -> None:
    decision = Policy(["GET example.test/docs/"]).request("example.test", 443, "GET", "/a/../b?token=s3cret")
    assert not decision.allowed and "s3cret" not in decision.reason and "/b" in decision.reason


def test_the_gateway_host_s_addresses_are_refused_even_inside_a_trusted_network() -> None:
    """An operator who trusts the egress subnet trusts the bridge's host address in it too: the
    host's own services must stay closed (a report-mode session would otherwise be let through)."""
    policy = Policy(
        [],
        trusted_networks=["172.30.0.0/16", "fd00::/8"],
        host_addresses=["172.30.0.1", "fd00::1"],
    )
    for host in ("172.30.0.1", "[fd00::1]", "[::ffff:172.30.0.1]", "2887647233"):  # the last: 172.30.0.1 as a number
        decision = policy.connect(host, 8080)
        assert (decision.allowed, decision.rule) == (False, "global-deny"), (host, decision)
        assert "gateway's host" in decision.reason
    assert policy.resolved("svc.test", "172.30.0.1").rule == "global-deny"
    assert policy.resolved("svc.test", "::ffff:172.30.0.1").rule == "global-deny"
    assert policy.resolved("svc.test", "172.30.0.7").allowed  # the rest of the trusted network stays open
    assert Policy([], allow_private=True, host_addresses=["172.30.0.1"]).connect("172.30.0.1", 80).rule == "global-deny"
    assert policy.with_allow(["example.test"]).connect("172.30.0.1", 80).rule == "global-deny"
