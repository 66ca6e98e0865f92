"""The sandbox's root stage: the firewall it sets, the policies it writes, how it drops privileges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.sandbox import boot
from corral.sandbox.init import chromium_argv, egress_flags


def test_firewall_allows_only_loopback_the_proxy_and_the_gateway_to_the_controller() -> None:
    rules = boot.firewall_rules("172.30.5.0/24", "172.30.5.1", [8080, 8081]).splitlines()
    assert rules[0] == "*filter" and rules[-1] == "COMMIT"
    assert ":OUTPUT DROP [0:0]" in rules and ":INPUT DROP [0:0]" in rules and ":FORWARD DROP [0:0]" in rules
    accepts = [r for r in rules if r.startswith("-A OUTPUT") and r.endswith("ACCEPT")]
    assert accepts == [
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A OUTPUT -p tcp -d 172.30.5.0/24 -m multiport --dports 8080,8081 -j ACCEPT",
    ]
    # The host's address on the bridge is refused before the subnet's proxy ports are allowed.
    host_rule = rules.index("-A OUTPUT -d 172.30.5.1/32 -j REJECT --reject-with icmp-admin-prohibited")
    assert host_rule < rules.index(accepts[2])
    assert "-A INPUT -p tcp -s 172.30.5.1/32 --dport 8765 -j ACCEPT" in rules


@pytest.mark.parametrize(
    ("network", "gateway"), [("172.30.5.0/24", "10.0.0.1"), ("not-a-net", "172.30.5.1"), ("172.30.5.0/24", "x")]
)
def test_firewall_refuses_nonsense(network: str, gateway: str) -> None:
    with pytest.raises(ValueError):
        boot.firewall_rules(network, gateway, [8080])


def test_chromium_policy_names_the_proxy_and_turns_the_side_doors_off() -> None:
    policy = boot.chromium_policy("corral-proxy:8080")
    assert policy["ProxySettings"] == {"ProxyMode": "fixed_servers", "ProxyServer": "http://corral-proxy:8080"}
    assert policy["QuicAllowed"] is False and policy["DnsOverHttpsMode"] == "off"
    assert policy["WebRtcIPHandling"] == "disable_non_proxied_udp"
    assert "ProxySettings" not in boot.chromium_policy(None)


def test_chromium_flags_say_the_same() -> None:
    argv = chromium_argv(1280, 800, "/tmp/p", egress_flags("corral-proxy:8080"))
    assert "--proxy-server=http://corral-proxy:8080" in argv and "--disable-quic" in argv
    assert "--force-webrtc-ip-handling-policy=disable_non_proxied_udp" in argv
    disable = [a for a in argv if a.startswith("--disable-features=")]
    assert len(disable) == 1 and "DnsOverHttps" in disable[0]  # Chromium honours only the last one
    assert egress_flags(None) == []


def test_privileges_go_entirely() -> None:
    argv = boot.drop_argv(["/usr/bin/tini", "--", "python"])
    assert argv[0] == "setpriv" and argv[-3:] == ["/usr/bin/tini", "--", "python"]
    for flag in ("--reuid=corral", "--regid=corral", "--clear-groups", "--bounding-set=-all", "--inh-caps=-all",
                 "--ambient-caps=-all", "--no-new-privs"):
        assert flag in argv


def test_lock_down_writes_policy_and_bundle_and_refuses_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boot, "RUN_DIR", tmp_path / "run")
    monkeypatch.setattr(boot, "CHROMIUM_POLICY", tmp_path / "run" / "policy.json")
    monkeypatch.setattr(boot, "CA_CERT", tmp_path / "run" / "ca.pem")
    certs = tmp_path / "certs"
    certs.mkdir()
    monkeypatch.setattr(boot, "SYSTEM_BUNDLE", certs / "ca-certificates.crt")
    pristine = tmp_path / "pristine.crt"
    pristine.write_text("-----BEGIN CERTIFICATE-----\nDEBIAN\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(boot, "PRISTINE_BUNDLE", pristine)
    cert = "-----BEGIN CERTIFICATE-----\nSESSION\n-----END CERTIFICATE-----"
    boot.lock_down({"CORRAL_CA_CERT": cert})
    assert json.loads((tmp_path / "run" / "policy.json").read_text())["QuicAllowed"] is False
    bundle = (certs / "ca-certificates.crt").read_text()
    assert "DEBIAN" in bundle and "SESSION" in bundle
    with pytest.raises(RuntimeError, match="nothing else"):
        boot.lock_down({"CORRAL_CA_CERT": cert + "\n-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"})
    with pytest.raises(RuntimeError, match="CORRAL_SESSION_NET"):
        boot.lock_down({"CORRAL_PROXY": "corral-proxy:8080"})
    with pytest.raises(ValueError, match="host:port"):
        boot.lock_down({"CORRAL_PROXY": "corral-proxy"})
