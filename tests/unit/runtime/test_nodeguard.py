"""A swarm node's host guard: what it blocks, and how one pass brings iptables to exactly that
(iptables faked at the guard's one seam; the real rules are played against in
tests/integration/swarm/test_node_guard.py)."""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from corral.runtime import SandboxSpec, SwarmOptions, nodeguard
from corral.runtime.nodeguard import COMMENT, Guard, Rule, blocked_networks, parse_rules, plan
from corral.runtime.swarm import SwarmRuntime, guardservice

from . import test_swarm as swarm_fakes  # the driver's narrow fake of the Docker API

# What `iptables -S DOCKER-USER` prints on a node (Docker's own return, someone else's rule, ours).
NOT_A_REPLY = "-m conntrack ! --ctstate RELATED,ESTABLISHED"
LISTING = f"""-N DOCKER-USER
-A DOCKER-USER -d 10.235.0.1/32 -i docker_gwbridge {NOT_A_REPLY} -m comment --comment {COMMENT} -j DROP
-A DOCKER-USER -d 10.9.0.0/16 -i docker_gwbridge -m comment --comment "an operator's" -j DROP
-A DOCKER-USER -d 10.235.0.7/32 -i br-other {NOT_A_REPLY} -m comment --comment {COMMENT} -j DROP
-A DOCKER-USER -j RETURN
"""


def net(text: str) -> nodeguard.Network:
    return ipaddress.ip_network(text)


class FakeIptables:
    """iptables (``rules``) and ip6tables (``rules6``), rules kept as their specs; -S, -I CHAIN 1
    and -D answered as iptables does."""

    def __init__(self, chains: Sequence[str] = ("DOCKER-USER", "FORWARD")) -> None:
        self.rules: dict[str, list[list[str]]] = {chain: [] for chain in chains}
        self.rules6: dict[str, list[list[str]]] = {chain: [] for chain in chains}
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        command, chain = argv[2], argv[3]
        tables = self.rules6 if argv[0].endswith("ip6tables") else self.rules
        if chain not in tables:
            return subprocess.CompletedProcess(argv, 1, "", f"iptables: No chain/target/match by that name ({chain})")
        rules = tables[chain]
        if command == "-S":
            listing = [f"-N {chain}", *(f"-A {chain} {shlex.join(rule)}" for rule in rules)]
            return subprocess.CompletedProcess(argv, 0, "\n".join(listing) + "\n", "")
        if command == "-I":
            rules.insert(int(argv[4]) - 1, argv[5:])
            return subprocess.CompletedProcess(argv, 0, "", "")
        if command == "-D" and argv[4:] in rules:
            rules.remove(argv[4:])
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.CompletedProcess(argv, 1, "", "Bad rule (does a matching rule exist in that chain?)")


@pytest.fixture(autouse=True)
def _input_guard(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The INPUT half is hostguard's own (tested in test_hostguard.py): record that it is asked for."""
    asked: list[str] = []

    def install(interface: str) -> bool:
        asked.append(interface)
        return True

    monkeypatch.setattr(nodeguard.hostguard, "install", install)
    monkeypatch.setattr(nodeguard.shutil, "which", lambda name: f"/usr/sbin/{name}")
    return asked


def test_only_our_rules_are_read_from_a_listing() -> None:
    assert parse_rules(LISTING) == {
        Rule("docker_gwbridge", net("10.235.0.1/32")),
        Rule("br-other", net("10.235.0.7/32")),
    }
    assert parse_rules('-A X -i a -d nonsense --comment corral-nodeguard\n-A "unbalanced') == set()


def test_blocked_are_the_given_hosts_names_resolved_and_the_node_s_own_addresses() -> None:
    resolved = {"registry.corral.test": ["10.235.0.9", "fd00::9"]}
    networks = blocked_networks(
        ["10.235.0.1", " 10.240.0.0/16 ", "registry.corral.test", "gone.invalid", ""],
        ["10.235.0.2", "172.18.0.1", "127.0.0.1", "fe80::1", "::1"],
        lambda name: resolved.get(name, []),
    )
    assert networks == {
        net("10.235.0.1/32"),
        net("10.240.0.0/16"),
        net("10.235.0.9/32"),
        net("fd00::9/128"),
        net("10.235.0.2/32"),
        net("172.18.0.1/32"),
    }  # loopback and link-local never arrive on the bridge; a name that does not resolve adds nothing


def test_plan_removes_what_is_no_longer_wanted_and_adds_what_is_missing() -> None:
    a, b, c = (Rule("docker_gwbridge", net(f"10.235.0.{n}/32")) for n in (1, 2, 3))
    assert plan({a, b}, {b, c}) == ([a], [c])
    assert plan({a}, {a}) == ([], [])


def test_a_pass_makes_the_chain_exactly_what_is_blocked_and_leaves_others_alone(_input_guard: list[str]) -> None:
    iptables = FakeIptables()
    foreign = ["-i", "docker_gwbridge", "-d", "10.9.0.0/16", "--comment", "an operator's", "-j", "DROP"]
    iptables.rules["DOCKER-USER"].append(foreign)
    guard = Guard("docker_gwbridge", run=iptables)

    assert guard.sync({net("10.235.0.1/32"), net("10.235.0.2/32"), net("fd00::9/128")})
    assert _input_guard == ["docker_gwbridge"]
    ours = parse_rules("\n".join(f"-A DOCKER-USER {shlex.join(rule)}" for rule in iptables.rules["DOCKER-USER"]))
    assert ours == {Rule("docker_gwbridge", net(f"10.235.0.{n}/32")) for n in (1, 2)}
    assert [rule[3] for rule in iptables.rules6["DOCKER-USER"]] == ["fd00::9/128"]  # v6 through ip6tables
    assert iptables.rules["DOCKER-USER"][-1] == foreign  # inserted ahead of what was there
    assert iptables.rules["FORWARD"] == []

    # A node left: its address is no longer blocked; a second pass with nothing new changes nothing.
    guard.sync({net("10.235.0.1/32")})
    remaining = [rule for rule in iptables.rules["DOCKER-USER"] if COMMENT in rule]
    assert [rule[rule.index("-d") + 1] for rule in remaining] == ["10.235.0.1/32"]
    writes = len(iptables.calls)
    guard.sync({net("10.235.0.1/32")})
    assert [call[2] for call in iptables.calls[writes:]] == ["-S", "-S", "-S", "-S"]  # reads only


def test_each_drop_spares_replies_and_names_the_bridge() -> None:
    spec = nodeguard.rule_spec(Rule("docker_gwbridge", net("10.235.0.1/32")))
    assert spec[:4] == ["-i", "docker_gwbridge", "-d", "10.235.0.1/32"]
    assert " ".join(spec).endswith("! --ctstate ESTABLISHED,RELATED -m comment --comment corral-nodeguard -j DROP")


def test_without_docker_s_chain_the_drops_go_into_forward() -> None:
    iptables = FakeIptables(chains=("FORWARD",))
    assert Guard("docker_gwbridge", run=iptables).sync({net("10.235.0.1/32")})
    assert iptables.rules["FORWARD"] and COMMENT in iptables.rules["FORWARD"][0]


def test_a_rule_iptables_refuses_makes_the_pass_incomplete_and_the_node_not_ready(tmp_path: Path) -> None:
    iptables = FakeIptables()

    def refusing(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[2] == "-I":
            return subprocess.CompletedProcess(list(argv), 4, "", "iptables: Permission denied")
        return iptables(argv)

    assert not Guard("docker_gwbridge", run=refusing).sync({net("10.235.0.1/32")})
    ready = tmp_path / "ok"
    nodeguard.mark_ready(ready, True)
    assert ready.exists()
    nodeguard.mark_ready(ready, False)
    assert not ready.exists()


def test_without_ip6tables_v6_networks_make_the_pass_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodeguard.shutil, "which", lambda name: "/usr/sbin/iptables" if name == "iptables" else None)
    iptables = FakeIptables()
    assert Guard("docker_gwbridge", run=iptables).sync({net("10.235.0.1/32")})
    assert not Guard("docker_gwbridge", run=iptables).sync({net("fd00::9/128")})


def test_remove_takes_out_every_rule_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    removed: list[str] = []
    monkeypatch.setattr(nodeguard.hostguard, "remove", removed.append)
    iptables = FakeIptables()
    guard = Guard("docker_gwbridge", run=iptables)
    guard.sync({net("10.235.0.1/32"), net("10.235.0.2/32")})
    guard.remove()
    assert removed == ["docker_gwbridge"]
    assert iptables.rules["DOCKER-USER"] == [] and iptables.rules6["DOCKER-USER"] == []


def test_too_many_networks_are_refused_before_any_rule() -> None:
    many = ",".join(f"10.{n // 256}.{n % 256}.1" for n in range(nodeguard.MAX_BLOCKED + 1))
    assert nodeguard.main(["--block", many, "--once"]) == 2


# The swarm side: what the runtime gives every node's guard.


def test_the_registry_host_is_read_from_an_image_reference() -> None:
    assert guardservice.registry_host("10.235.0.1:5000/corral-desktop:latest") == "10.235.0.1"
    assert guardservice.registry_host("registry.corral.test/corral/desktop@sha256:ab") == "registry.corral.test"
    assert guardservice.registry_host("[fd00::1]:5000/corral-desktop:x") == "fd00::1"
    assert guardservice.registry_host("localhost:5000/x") == "localhost"
    assert guardservice.registry_host("corral-desktop:latest") is None
    assert guardservice.registry_host("library/debian") is None


def test_every_node_and_manager_address_is_blocked_once() -> None:
    nodes = [
        {"Status": {"Addr": "10.235.0.1"}, "ManagerStatus": {"Addr": "10.235.0.1:2377"}},
        {"Status": {"Addr": "0.0.0.0"}, "ManagerStatus": {"Addr": "192.0.2.10:2377"}},
        {"Status": {"Addr": "10.235.0.3"}},
        {"Status": {}},
    ]
    assert guardservice.node_addresses(nodes) == ["10.235.0.1", "192.0.2.10", "10.235.0.3"]
    assert guardservice.guard_args(["10.235.0.3", "10.235.0.1", "10.235.0.1"]) == [
        "--block",
        "10.235.0.1,10.235.0.3",
        "--ready-file",
        guardservice.READY_FILE,
    ]


def test_a_guard_is_everywhere_only_when_no_ready_node_lacks_one() -> None:
    assert guardservice.GuardState(frozenset({"n1", "n2"}), frozenset()).everywhere
    assert not guardservice.GuardState(frozenset({"n1"}), frozenset({"n3"})).everywhere
    assert not guardservice.GuardState(frozenset(), frozenset()).everywhere


def test_the_keeper_refreshes_at_most_every_interval_and_survives_a_silent_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    calls: list[str] = []
    answers: list[guardservice.GuardState | Exception] = [
        guardservice.GuardState(frozenset({"n1"}), frozenset({"n2"})),
        guardservice.GuardState(frozenset({"n1", "n2"}), frozenset()),
        guardservice.docker.errors.APIError("manager gone"),
    ]

    def ensure(client: object, image: str, registry: str | None, labels: object) -> guardservice.GuardState:
        calls.append(image)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(guardservice, "ensure", ensure)
    keeper = guardservice.GuardKeeper(object(), "reg.test:5000/corral-desktop:x", every_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    assert not keeper.ensure().everywhere  # n2's guard not up yet: n2 stays unlabelled
    now[0] += 10
    assert keeper.refresh() is None and len(calls) == 1  # not due
    now[0] += 25
    assert keeper.refresh() == guardservice.GuardState(frozenset({"n1", "n2"}), frozenset())
    now[0] += 31
    assert keeper.refresh() is None  # the manager did not answer: logged, labels left as they were
    assert keeper.state.everywhere and len(calls) == 3


# The swarm driver with a guard: sessions only on guarded nodes, and the health's host_guard from it.


def _guarded_runtime(api: Any, monkeypatch: pytest.MonkeyPatch, state: guardservice.GuardState) -> SwarmRuntime:
    monkeypatch.setattr(guardservice, "ensure", lambda client, image, registry, labels: state)
    monkeypatch.setattr(guardservice, "SETTLE_S", 0.0)  # no waiting for a guard that is not everywhere
    options = SwarmOptions(gateway_container="gw", start_timeout_s=5, guard_image="reg.test:5000/corral-desktop:x")
    return SwarmRuntime(client=swarm_fakes.FakeClient(api), options=options)  # type: ignore[arg-type]


def test_a_swarm_runtime_with_a_guard_places_sandboxes_on_guarded_nodes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = swarm_fakes._task("running") | {
        "NetworksAttachments": [
            {"Network": {"Spec": {"Name": swarm_fakes.SESSION.name}}, "Addresses": ["10.213.0.2/28"]}
        ]
    }
    api = swarm_fakes.FakeApi(task=running)
    runtime = _guarded_runtime(api, monkeypatch, guardservice.GuardState(frozenset({"crl-d-2"}), frozenset()))
    runtime.start_sandbox(SandboxSpec(name="sbx", session_network=swarm_fakes.SESSION))
    assert guardservice.PLACEMENT in api.services["sbx"]["template"]["Placement"]["Constraints"]


def test_the_host_guard_is_reported_only_when_it_runs_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    half = guardservice.GuardState(frozenset({"crl-d-1"}), frozenset({"crl-d-2"}))
    assert not _guarded_runtime(swarm_fakes.FakeApi(), monkeypatch, half).guard_everywhere()
    whole = guardservice.GuardState(frozenset({"crl-d-1", "crl-d-2"}), frozenset())
    assert _guarded_runtime(swarm_fakes.FakeApi(), monkeypatch, whole).guard_everywhere()

    def silent(client: object, image: str, registry: str | None, labels: object) -> guardservice.GuardState:
        raise guardservice.docker.errors.APIError("no such image")

    monkeypatch.setattr(guardservice, "ensure", silent)
    monkeypatch.setattr(guardservice, "SETTLE_S", 0.0)
    options = SwarmOptions(guard_image="reg.test:5000/corral-desktop:x")
    runtime = SwarmRuntime(client=swarm_fakes.FakeClient(swarm_fakes.FakeApi()), options=options)  # type: ignore[arg-type]
    assert runtime.guard_everywhere() is False  # logged; nothing is placed until it runs


def test_a_starting_runtime_waits_a_bounded_time_for_the_guard_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    states = [
        guardservice.GuardState(frozenset(), frozenset({"n1", "n2"})),
        guardservice.GuardState(frozenset({"n1"}), frozenset({"n2"})),
        guardservice.GuardState(frozenset({"n1", "n2"}), frozenset()),
    ]
    monkeypatch.setattr(guardservice, "ensure", lambda *args: states.pop(0) if len(states) > 1 else states[0])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    keeper = guardservice.GuardKeeper(object(), "x", clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    assert keeper.settle(limit_s=60).everywhere and now[0] == 2.0
    stuck = guardservice.GuardState(frozenset({"n1"}), frozenset({"n2"}))
    monkeypatch.setattr(guardservice, "ensure", lambda *args: stuck)
    assert not keeper.settle(limit_s=5).everywhere and now[0] == 7.0  # gave up after its bound


class _Node:
    """A node of the manager's list as docker's model shows it: its record and its spec's updates."""

    def __init__(self, ident: str, state: str, labels: dict[str, str]) -> None:
        self.id = ident
        self.attrs: dict[str, Any] = {
            "ID": ident,
            "Status": {"State": state},
            "Description": {"Hostname": ident},
            "Spec": {"Labels": dict(labels), "Role": "worker", "Availability": "active"},
        }

    def update(self, spec: dict[str, Any]) -> None:
        self.attrs["Spec"] = spec

    @property
    def labelled(self) -> bool:
        return self.attrs["Spec"]["Labels"].get(guardservice.NODE_LABEL) == "on"


def test_a_node_that_went_down_loses_its_guard_label_and_comes_back_unlabelled() -> None:
    """A node that went down (a reboot, a cut) comes back with none of the guard's iptables rules:
    its label must not outlive it, or Swarm places a session there before its guard's first pass."""
    up = _Node("n1", "ready", {guardservice.NODE_LABEL: "on"})
    down = _Node("n2", "down", {guardservice.NODE_LABEL: "on"})
    client = type("Client", (), {"nodes": type("Nodes", (), {"list": staticmethod(lambda: [up, down])})()})()
    service = type("Service", (), {"tasks": lambda self, filters: [{"NodeID": "n1", "Status": {"State": "running"}}]})()
    state = guardservice.mark_nodes(client, service)  # type: ignore[arg-type]
    assert up.labelled and not down.labelled
    assert state == guardservice.GuardState(frozenset({"n1"}), frozenset())
