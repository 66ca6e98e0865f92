"""Host-guard reconcile: rules of interfaces that are gone are removed, others stay (iptables faked)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.runtime import hostguard

LISTING = """-P INPUT ACCEPT
-A INPUT -i br-live -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment corral-hostguard -j ACCEPT
-A INPUT -i br-live -m comment --comment corral-hostguard -j DROP
-A INPUT -i br-gone -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment corral-hostguard -j ACCEPT
-A INPUT -i br-gone -m comment --comment corral-hostguard -j DROP
-A INPUT -i eth0 -m comment --comment "someone else" -j DROP
-A INPUT -i docker0 -j ACCEPT
"""


def test_only_the_rules_of_missing_interfaces_are_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = {line for line in LISTING.splitlines() if line.startswith("-A")}
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[2] == "-S":
            return subprocess.CompletedProcess(argv, 0, "\n".join(sorted(rules)), "")
        if argv[2] == "-D":
            wanted = argv[3:]
            for rule in list(rules):
                words = rule.split()[1:]
                # iptables matches by meaning; the listing prints the states in its own order.
                if sorted(w.replace('"', "") for w in words) == sorted(
                    w.replace("ESTABLISHED,RELATED", "RELATED,ESTABLISHED") for w in wanted
                ):
                    rules.discard(rule)
                    return subprocess.CompletedProcess(argv, 0, "", "")
            return subprocess.CompletedProcess(argv, 1, "", "Bad rule")
        raise AssertionError(argv)

    monkeypatch.setattr(hostguard.shutil, "which", lambda name: "/sbin/iptables")
    monkeypatch.setattr(hostguard.subprocess, "run", run)
    assert hostguard.guarded_interfaces() == {"br-live", "br-gone"}
    assert hostguard.remove_stale(exists=lambda name: name != "br-gone") == ["br-gone"]
    assert not any("br-gone" in rule for rule in rules)
    assert sum("br-live" in rule for rule in rules) == 2  # a live bridge keeps its guard
    assert any("someone else" in rule for rule in rules)  # and nobody else's rule is touched


def test_without_iptables_nothing_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostguard.shutil, "which", lambda name: None)
    assert hostguard.remove_stale(exists=lambda name: False) == []


def test_the_host_s_own_addresses_are_read_from_the_kernel(tmp_path: Path) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "     +-- 10.213.0.0/28 2 0 2\n        |-- 10.213.0.1\n           /32 host LOCAL\n"
        "        |-- 10.213.0.15\n           /32 link BROADCAST\n"
        "Local:\n  +-- 10.213.0.0/28 2 0 2\n        |-- 10.213.0.1\n           /32 host LOCAL\n"
        "     |-- 127.0.0.1\n        /32 host LOCAL\n"
    )
    inet6 = tmp_path / "if_inet6"
    inet6.write_text("fe80000000000000004295fffe91b801 287 40 20 80 br-d695ad6896fc\n")
    assert hostguard.local_addresses(fib, inet6) == ["10.213.0.1", "127.0.0.1", "fe80::42:95ff:fe91:b801"]
    assert hostguard.local_addresses(tmp_path / "none", tmp_path / "none") == []
