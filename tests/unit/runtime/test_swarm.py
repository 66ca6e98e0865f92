"""The swarm driver's pure parts (task and node readings, service specs, addresses, the proxy's
seed) and its behaviour against a narrow fake of the Docker API (what it leaves behind on a failure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors
import pytest

from corral.contracts import auth
from corral.errors import SandboxError
from corral.proxy import seed
from corral.runtime import NODE_LOST, ExitInfo, SandboxSpec, SessionNetwork, SwarmOptions
from corral.runtime.swarm import SwarmRuntime
from corral.runtime.swarm.engine import exit_of, newest_task, runtime_state, task_address
from corral.runtime.swarm.networks import gateway_address
from corral.runtime.swarm.sandboxes import sandbox_service


def _task(
    state: str, *, code: int | None = None, err: str = "", created: str = "2026-01-01", node: str = "n1"
) -> dict[str, Any]:
    status: dict[str, Any] = {"State": state, "Err": err}
    if code is not None:
        status["ContainerStatus"] = {"ExitCode": code}
    return {"Status": status, "CreatedAt": created, "NodeID": node, "ID": f"t-{state}-{created}"}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("pending", "created"),
        ("preparing", "created"),
        ("running", "running"),
        ("complete", "exited"),
        ("shutdown", "exited"),
        ("failed", "dead"),
        ("rejected", "dead"),
        ("orphaned", "dead"),
    ],
)
def test_a_tasks_state_as_the_runtimes(state: str, expected: str) -> None:
    assert runtime_state(_task(state), node_down=False) == expected


def test_a_running_task_on_a_node_that_is_gone_is_dead_and_ended_by_node_lost() -> None:
    task = _task("running")
    assert runtime_state(task, node_down=True) == "dead"
    assert exit_of(task, "crl-d-2", node_down=True) == ExitInfo(NODE_LOST, None, False, "crl-d-2")
    assert exit_of(_task("orphaned"), "crl-d-3", node_down=False) == ExitInfo(NODE_LOST, None, False, "crl-d-3")


def test_how_a_task_ended() -> None:
    assert exit_of(_task("running"), "n", node_down=False) is None
    assert exit_of(_task("complete", code=0), "n", node_down=False) == ExitInfo("exited", 0, False, "n")
    assert exit_of(_task("failed", code=137, err="OOMKilled"), "n", False) == ExitInfo("dead", 137, True, "n")
    assert exit_of(None, "", node_down=False) == ExitInfo("gone", None, False, "")
    # An ended task's node going afterwards changes nothing: it ended as it did.
    assert exit_of(_task("failed", code=3), "n", node_down=True) == ExitInfo("dead", 3, False, "n")


def test_the_newest_task_is_the_services() -> None:
    old, new = _task("failed", created="2026-01-01T00:00:01"), _task("running", created="2026-01-01T00:00:02")
    assert newest_task([new, old]) is new and newest_task([]) is None


def test_a_tasks_address_on_a_network() -> None:
    task = {
        "NetworksAttachments": [
            {"Network": {"Spec": {"Name": "ingress"}}, "Addresses": ["10.0.0.5/24"]},
            {"Network": {"Spec": {"Name": "corral-net-s1"}}, "Addresses": ["10.213.0.2/28"]},
        ]
    }
    assert task_address(task, "corral-net-s1") == "10.213.0.2"
    assert task_address(task, "other") == ""


def test_the_gateway_sits_on_the_last_address_of_a_sessions_overlay() -> None:
    assert gateway_address("10.213.0.16/28") == "10.213.0.30"


SESSION = SessionNetwork("corral-net-s1", "10.213.0.0/28", "10.213.0.14")


def test_a_sandbox_service_keeps_the_docker_drivers_hardening() -> None:
    spec = SandboxSpec(image="reg:5000/corral-desktop:latest", session_network=SESSION, memory="2g", cpus=1.5, pids=512)
    args = sandbox_service(spec, "corral-sandbox-x", [], ("node.role==worker",))
    template = args["task_template"]
    container = template["ContainerSpec"]
    assert container["User"] == "root" and container["ReadOnly"] is True
    assert container["CapabilityDrop"] == ["ALL"]
    assert set(container["CapabilityAdd"]) == {
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SETPCAP",
        "CAP_CHOWN",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
    }
    assert container["Healthcheck"]["Test"] == ["NONE"]
    env = dict(item.split("=", 1) for item in container["Env"])
    assert env["CORRAL_SECRET_GIVEN"] == "1" and env["CORRAL_INNER_BOUNDARY"] == "required"
    assert env["CORRAL_SESSION_GATEWAY"] == "10.213.0.14" and env["CORRAL_PROXY"] == "corral-proxy:8080"
    assert template["RestartPolicy"]["Condition"] == "none"
    assert template["Resources"]["Limits"] == {"NanoCPUs": 1_500_000_000, "MemoryBytes": 2 << 30, "Pids": 512}
    assert template["Placement"]["Constraints"] == ["node.role==worker"]
    assert [n["Target"] for n in template["Networks"]] == ["corral-net-s1"]
    assert args["endpoint_spec"]["Mode"] == "dnsrr"
    mounts = {m["Target"]: m for m in container["Mounts"]}
    agent = mounts["/home/agent"]["VolumeOptions"]["DriverConfig"]["Options"]["o"]
    assert "uid=1100" in agent and "exec" in agent.split(",") and "nosuid" in agent
    assert "noexec" in mounts["/run"]["VolumeOptions"]["DriverConfig"]["Options"]["o"]
    assert mounts["/dev/shm"]["Type"] == "tmpfs" and mounts["/dev/shm"]["TmpfsOptions"]["SizeBytes"] == 256 << 20


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SandboxSpec(), "needs a network"),
        (SandboxSpec(network="n", workspace_mount="/mnt/v"), "workspace volumes"),
        (SandboxSpec(network="n", runtime="runsc"), "OCI runtime"),
    ],
)
def test_what_a_swarm_cannot_give_a_sandbox_is_refused_by_name(spec: SandboxSpec, message: str) -> None:
    with pytest.raises(SandboxError, match=message):
        sandbox_service(spec, "s", [], ())


class FakeApi:
    """The few Docker API calls of a sandbox's start, recording what was made and removed."""

    def __init__(self, *, refuse_service: bool = False, task: dict[str, Any] | None = None) -> None:
        self.refuse_service, self.task = refuse_service, task
        self.made: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}

    def info(self) -> dict[str, Any]:
        return {"Swarm": {"LocalNodeState": "active", "ControlAvailable": True}}

    def create_secret(self, name: str, data: bytes, labels: dict[str, str]) -> dict[str, str]:
        self.made[name] = {"ID": name, "Spec": {"Name": name, "Labels": labels}, "data": data}
        return {"ID": name}

    def secrets(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        wanted = dict(f.split("=", 1) for f in filters["label"])
        return [s for s in self.made.values() if all(s["Spec"]["Labels"].get(k) == v for k, v in wanted.items())]

    def remove_secret(self, ident: str) -> None:
        del self.made[ident]

    def create_service(self, task_template: Any, name: str, **_: Any) -> dict[str, str]:
        if self.refuse_service:
            raise docker.errors.APIError("refused", explanation="no such network")
        self.services[name] = {"ID": name, "Spec": {"Name": name}, "template": task_template}
        return {"ID": name}

    def inspect_service(self, ident: str) -> dict[str, Any]:
        if ident not in self.services:
            raise docker.errors.NotFound("gone")
        return self.services[ident]

    def remove_service(self, ident: str) -> None:
        self.services.pop(ident, None)

    def tasks(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        return [self.task] if self.task is not None else []

    def nodes(self) -> list[dict[str, Any]]:
        return [{"ID": "n1", "Description": {"Hostname": "crl-d-2"}, "Status": {"State": "ready"}}]


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def info(self) -> dict[str, Any]:
        return self.api.info()


def _runtime(api: FakeApi, tmp_path: Path) -> SwarmRuntime:
    options = SwarmOptions(gateway_container="gw", start_timeout_s=5, secrets_dir=tmp_path / "kept")
    return SwarmRuntime(client=FakeClient(api), options=options)  # type: ignore[arg-type]


def test_a_sandbox_starts_with_its_secret_given_to_the_controller_and_kept_for_a_restart(tmp_path: Path) -> None:
    running = _task("running") | {
        "NetworksAttachments": [{"Network": {"Spec": {"Name": SESSION.name}}, "Addresses": ["10.213.0.2/28"]}]
    }
    api = FakeApi(task=running)
    address = _runtime(api, tmp_path).start_sandbox(SandboxSpec(name="sbx", session_network=SESSION))
    assert (address.host, address.port, address.node) == ("10.213.0.2", 8765, "crl-d-2")
    [given] = api.made.values()
    assert given["data"] == address.secret.encode() + b"\n"
    [ref] = api.services["sbx"]["template"]["ContainerSpec"]["Secrets"]
    assert ref["File"] == {"Name": str(auth.SECRET_FILE), "UID": "1000", "GID": "1000", "Mode": 0o400}
    assert (tmp_path / "kept" / "sbx").read_text() == address.secret
    _runtime(api, tmp_path).remove("sbx")
    assert api.services == {} and api.made == {} and not (tmp_path / "kept" / "sbx").exists()


@pytest.mark.parametrize(
    ("api", "message"),
    [
        (FakeApi(refuse_service=True), "no such network"),
        (FakeApi(task=_task("rejected", err="No such image: reg:5000/corral-desktop:latest")), "No such image"),
    ],
)
def test_a_sandbox_that_cannot_start_leaves_no_service_and_no_secret(
    api: FakeApi, message: str, tmp_path: Path
) -> None:
    with pytest.raises(SandboxError, match=message):
        _runtime(api, tmp_path).start_sandbox(SandboxSpec(name="sbx", session_network=SESSION))
    assert api.services == {} and api.made == {}


def test_a_node_that_leaves_during_a_start_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    api = FakeApi(task=_task("starting", node="n-gone"))
    with pytest.raises(SandboxError, match="node n-gone left while sandbox sbx was starting"):
        _runtime(api, tmp_path).start_sandbox(SandboxSpec(name="sbx", session_network=SESSION))
    assert api.services == {} and api.made == {}


def test_an_engine_that_is_no_swarm_manager_is_refused(tmp_path: Path) -> None:
    api = FakeApi()
    api.info = lambda: {"Swarm": {"LocalNodeState": "inactive"}}  # type: ignore[method-assign]
    with pytest.raises(SandboxError, match="no swarm manager"):
        _runtime(api, tmp_path)


def test_single_host_operations_are_refused_naming_the_driver(tmp_path: Path) -> None:
    runtime = _runtime(FakeApi(), tmp_path)
    with pytest.raises(
        SandboxError, match=r"a browser state's export: not on the swarm driver \(CORRAL_RUNTIME=swarm\)"
    ):
        runtime.export_browser_state("x", 1)
    with pytest.raises(SandboxError, match="workspace volumes: not on the swarm driver"):
        runtime.make_volume(tmp_path / "v.img", 10)
    with pytest.raises(SandboxError, match="template builds: not on the swarm driver"):
        runtime.build_image(b"", "t", {}, print, "", "n")
    assert runtime.attached_volumes(tmp_path) == []


def test_the_seed_names_the_cas_files_as_the_gateway_writes_them() -> None:
    from corral.proxy import ca

    assert {f"ca/{ca.KEY_AND_CERT}", f"ca/{ca.CERT_ONLY}"} <= set(seed.SEED_FILES)


class NetworkApi(FakeApi):
    """The network calls: what was made, joined, left and removed, in order."""

    def __init__(self, *, taken: list[str] | None = None, busy: int = 0) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []
        self.taken = [{"IPAM": {"Config": [{"Subnet": subnet}]}} for subnet in taken or []]
        self.busy = busy  # removals refused as "in use by task" before one succeeds
        self.driver_options: dict[str, str] | None = None  # the overlay driver's options of the last made

    def networks(self, names: list[str] | None = None, filters: Any = None) -> list[dict[str, Any]]:
        return self.taken

    def create_network(self, name: str, **options: Any) -> dict[str, str]:
        assert options["driver"] == "overlay" and options["internal"] and options["attachable"]
        self.calls.append(("create", name, options["ipam"]["Config"][0]["Subnet"]))
        self.driver_options = options.get("options")
        return {"Id": f"id-{name}"}

    def connect_container_to_network(self, container: str, network: str, ipv4_address: str | None = None) -> None:
        self.calls.append(("join", container, network, str(ipv4_address)))

    def disconnect_container_from_network(self, container: str, network: str, force: bool = False) -> None:
        self.calls.append(("leave", container, network))

    def remove_network(self, name: str) -> None:
        if self.busy:
            self.busy -= 1
            raise docker.errors.APIError("busy", explanation=f"network {name} is in use by task t1")
        self.calls.append(("remove", name))


def test_a_sessions_overlay_takes_a_free_subnet_and_the_gateway_joins_it_at_its_last_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new runtime starts at a random place in the pool (what a restart freed lies at its head): here the last.
    monkeypatch.setattr("corral.runtime.swarm.networks.random.choice", lambda candidates: candidates[-1])
    api = NetworkApi(taken=["10.213.0.0/28"])
    network = _runtime(api, tmp_path).create_session_network("s1", {"corral.gateway": "g"}, "10.213.0.0/24")
    assert network == SessionNetwork("corral-net-s1", "10.213.0.16/28", "10.213.0.30")
    assert api.calls == [
        ("create", "corral-net-s1", "10.213.0.16/28"),
        ("join", "gw", "id-corral-net-s1", "10.213.0.30"),
    ]


def test_the_gateway_leaves_an_overlay_before_it_goes_and_a_task_still_on_it_is_waited_for(tmp_path: Path) -> None:
    api = NetworkApi(busy=2)
    runtime = _runtime(api, tmp_path)
    runtime._pause = lambda seconds: None  # type: ignore[method-assign]
    runtime.remove_session_network(SessionNetwork("corral-net-s1", "10.213.0.0/28", "10.213.0.14"))
    assert api.calls == [("leave", "gw", "corral-net-s1"), ("remove", "corral-net-s1")]


def test_an_overlay_gone_between_its_lookup_and_its_removal_counts_as_removed(tmp_path: Path) -> None:
    """Two removals of one session's overlay (its pair's, the orphans' sweep at start): the manager
    answers the second with a 500 that names the network's id, not a 404."""

    class GoneApi(NetworkApi):
        def remove_network(self, name: str) -> None:
            self.calls.append(("remove", name))
            raise docker.errors.APIError("500", explanation="network pwdr7fbbst3wj2jnsm8wklbk8 not found")

    api = GoneApi()
    _runtime(api, tmp_path).remove_session_network(SessionNetwork("corral-net-s1", "10.213.0.0/28", "10.213.0.14"))
    assert api.calls == [("leave", "gw", "corral-net-s1"), ("remove", "corral-net-s1")]


def test_a_join_the_engine_answers_not_found_is_asked_again(tmp_path: Path) -> None:
    """Right after a node rejoined: the join after a timed-out one was answered "network <id> not
    found" for an overlay the manager had just made; asked again, it joined."""

    answers = ["context deadline exceeded", "network 3o2xsw6n5j96cmy85beuik4ca not found"]

    class LateApi(NetworkApi):
        def connect_container_to_network(self, container: str, network: str, ipv4_address: str | None = None) -> None:
            if answers:
                raise docker.errors.APIError("500", explanation=answers.pop(0))
            super().connect_container_to_network(container, network, ipv4_address=ipv4_address)

    api = LateApi()
    runtime = _runtime(api, tmp_path)
    pauses: list[float] = []
    runtime._pause = pauses.append  # type: ignore[method-assign]
    runtime.create_session_network("s1", {}, "10.213.0.0/26")
    assert [c[0] for c in api.calls] == ["create", "join"] and pauses == [1.0]


def test_any_other_refusal_of_an_overlays_removal_is_said(tmp_path: Path) -> None:
    class RefusingApi(NetworkApi):
        def remove_network(self, name: str) -> None:
            raise docker.errors.APIError("500", explanation="rpc error: the manager is not the leader")

    with pytest.raises(SandboxError, match="cannot remove corral-net-s1: rpc error"):
        _runtime(RefusingApi(), tmp_path).remove_session_network(SessionNetwork("corral-net-s1", "", ""))


def test_a_subnet_just_freed_is_the_last_taken_again() -> None:
    from ipaddress import ip_network

    from corral.runtime.swarm.networks import rotated

    pool = list(ip_network("10.213.0.0/26").subnets(new_prefix=28))
    assert rotated(pool, None) == pool
    assert rotated(pool, pool[1]) == [pool[2], pool[3], pool[0], pool[1]]


def test_overlays_made_one_after_another_take_the_next_free_subnet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.runtime.swarm.networks.random.choice", lambda candidates: candidates[-1])
    api = NetworkApi()
    runtime = _runtime(api, tmp_path)
    first = runtime.create_session_network("s1", {}, "10.213.0.0/26")
    second = runtime.create_session_network("s2", {}, "10.213.0.0/26")  # s1's freed meanwhile (the fake lists none)
    assert (first.subnet, second.subnet) == ("10.213.0.0/28", "10.213.0.16/28")


@pytest.mark.parametrize(("encrypted", "driver_options"), [(False, None), (True, {"encrypted": ""})])
def test_a_sessions_overlay_is_encrypted_when_the_operator_asks(
    tmp_path: Path, encrypted: bool, driver_options: dict[str, str] | None
) -> None:
    """docs/swarm.md tells an operator on a LAN they do not trust to use encrypted overlays: the
    driver makes the sessions' overlays itself, so the setting must reach it."""
    api = NetworkApi()
    options = SwarmOptions(gateway_container="gw", encrypted_overlays=encrypted)
    SwarmRuntime(client=FakeClient(api), options=options).create_session_network("s1", {}, "10.213.0.0/24")  # type: ignore[arg-type]
    assert api.driver_options == driver_options


def test_the_gateways_setting_reaches_the_swarm_driver(tmp_path: Path) -> None:
    from corral.gateway.app import swarm_options
    from corral.gateway.settings import GatewaySettings

    settings = GatewaySettings(data_dir=tmp_path, swarm_encrypted_overlays=True, egress_upstream_ca=None)
    assert swarm_options(settings).encrypted_overlays is True


def test_a_gateway_container_made_anew_joins_the_session_overlays_it_finds_again(tmp_path: Path) -> None:
    api = NetworkApi()
    api.taken = [{"Name": "corral-net-s1", "Driver": "overlay", "IPAM": {"Config": [{"Subnet": "10.213.0.16/28"}]}}]
    _runtime(api, tmp_path).rejoin_session_networks({"corral.gateway": "g"})
    # At the address the sandbox's firewall lets reach the controller (its overlay's last host address).
    assert api.calls == [("join", "gw", "corral-net-s1", "10.213.0.30")]


class SlowManagerApi(NetworkApi):
    """A manager that times out allocating the gateway's attachment ``timeouts`` times first, each
    after ``attempt_s`` of the clock (about 20 s on the test swarm)."""

    def __init__(self, timeouts: int, attempt_s: float = 20.0) -> None:
        super().__init__()
        self.timeouts, self.attempt_s = timeouts, attempt_s
        self.clock = 0.0

    def connect_container_to_network(self, container: str, network: str, ipv4_address: str | None = None) -> None:
        if self.timeouts:
            self.timeouts -= 1
            self.clock += self.attempt_s
            self.calls.append(("timed out", network))
            raise docker.errors.APIError("500", explanation="attaching to network failed: context deadline exceeded")
        super().connect_container_to_network(container, network, ipv4_address)


def _on_the_managers_clock(api: SlowManagerApi, tmp_path: Path) -> SwarmRuntime:
    runtime = _runtime(api, tmp_path)
    runtime._now = lambda: api.clock  # type: ignore[method-assign]
    runtime._pause = lambda seconds: None  # type: ignore[method-assign]
    return runtime


def test_a_join_the_manager_timed_out_is_asked_again_within_the_patience(tmp_path: Path) -> None:
    """Seen right after a cut worker rejoined: three timeouts in a row (42 s), then the start failed."""
    from corral.runtime.swarm.networks import JOIN_PATIENCE_S

    api = SlowManagerApi(timeouts=5)  # 100 s of timeouts: still within the patience
    network = _on_the_managers_clock(api, tmp_path).create_session_network("s1", {}, "10.213.0.0/28")
    assert api.calls[-1] == ("join", "gw", "id-corral-net-s1", network.gateway)
    assert [c for c in api.calls if c[0] == "timed out"] == [("timed out", "id-corral-net-s1")] * 5
    failing = SlowManagerApi(timeouts=100)
    with pytest.raises(SandboxError, match="context deadline exceeded"):
        _on_the_managers_clock(failing, tmp_path).create_session_network("s2", {}, "10.213.0.0/28")
    # Asked until the patience ran out (the attempt that crossed it is the last), not for ever.
    assert len([c for c in failing.calls if c[0] == "timed out"]) == JOIN_PATIENCE_S // failing.attempt_s
    assert ("remove", "id-corral-net-s2") in failing.calls  # nothing left: the overlay goes with the failed join


def test_a_proxy_service_is_one_task_of_its_own_uid_on_its_session_and_egress_overlays(tmp_path: Path) -> None:
    from corral.runtime import ProxySpec
    from corral.runtime.swarm.egress import SEED_DIR, STATE_DIR_LABEL, proxy_service

    network = SessionNetwork("corral-net-s1", "10.213.0.16/28", "10.213.0.30")
    spec = ProxySpec("s1", network, tmp_path / "state", "corral-egress", memory="512m", cpus=1.0, pids=256)
    args = proxy_service(spec, 1001, [], ("node.labels.corral.hostguard==on",))
    template = args["task_template"]
    assert template["RestartPolicy"]["Condition"] == "none"  # the gateway's watchdog restarts it, reseeded
    assert template["Resources"]["Limits"] == {"NanoCPUs": 1_000_000_000, "MemoryBytes": 512 << 20, "Pids": 256}
    assert template["Placement"]["Constraints"] == ["node.labels.corral.hostguard==on"]
    assert template["LogDriver"]["Name"] == "json-file"
    assert [(n["Target"], n.get("Aliases")) for n in template["Networks"]] == [
        ("corral-net-s1", ["corral-proxy"]),
        ("corral-egress", None),
    ]
    container = template["ContainerSpec"]
    assert container["User"] == "1001:1001" and container["ReadOnly"] is True
    assert container["Env"] and f"CORRAL_SEED_DIR={SEED_DIR}" in container["Env"]
    assert args["labels"][STATE_DIR_LABEL] == str(tmp_path / "state")


def test_each_look_at_the_nodes_refreshes_the_host_guard(tmp_path: Path) -> None:
    # The reaper looks at the nodes every few ticks, sessions or none: that look keeps each node's
    # guard label true (a node back from down labelled again), not only a listing of sandboxes.
    class Guard:
        refreshed = 0

        def refresh(self) -> None:
            self.refreshed += 1

    runtime = _runtime(FakeApi(), tmp_path)
    guard = Guard()
    runtime.guard = guard  # type: ignore[assignment]
    runtime.nodes()
    runtime.nodes()
    assert guard.refreshed == 2
