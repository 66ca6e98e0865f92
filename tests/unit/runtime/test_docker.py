"""The Docker driver's own decisions, with the docker client faked at its narrowest seam: what it
mounts into a container belongs to the uid that runs there (the proxy's state, the sandbox's
token), a sandbox behind a proxy is told where the proxy is, and the names it gives. The real
engine runs in the integration tests."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from corral.contracts import auth
from corral.gateway.egress import EgressManager
from corral.gateway.settings import GatewaySettings
from corral.proxy.seed import parse_manifest
from corral.runtime import ProxySpec, SandboxSpec, SessionNetwork
from corral.runtime.docker import (
    CONTROLLER_UID,
    MIN_HEADROOM_MIB,
    DockerRuntime,
    agent_tmpfs_mib,
    default_proxy_uid,
    mebibytes,
    proxy_name,
    remapped_root,
    sandbox_options,
    session_network_name,
)
from corral.runtime.docker.handover import GivenSecret

SID = "ses_0123456789abcdef"
NETWORK = SessionNetwork(session_network_name(SID), "10.213.0.0/28", "10.213.0.1")


class FakeContainer:
    id = "c0ffee"
    status = "running"

    def __init__(self, name: str, network: str) -> None:
        self.name = name
        self.attrs = {"NetworkSettings": {"Networks": {network: {"IPAddress": "10.213.0.2"}}}}

    def start(self) -> None:
        pass

    def reload(self) -> None:
        pass

    def exec_run(self, argv: list[str], **_: Any) -> tuple[int, bytes]:
        return 0, b"s3cret\n"  # the controller's per-boot secret, read as its uid


class FakeNetwork:
    def connect(self, container: FakeContainer, aliases: list[str]) -> None:
        pass


class FakeClient:
    """containers.create/run and get, networks.get, the endpoint config: what a start touches."""

    def __init__(self) -> None:
        self.created: dict[str, Any] = {}
        self.containers = self
        self.networks = self
        self.api = self
        self._container: FakeContainer | None = None

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"SecurityOptions": ["name=seccomp,profile=default"], "DockerRootDir": "/var/lib/docker"}

    def create(self, image: str, **kwargs: Any) -> FakeContainer:
        self.created = kwargs
        self._container = FakeContainer(kwargs["name"], NETWORK.name)
        return self._container

    def run(self, image: str, **kwargs: Any) -> FakeContainer:
        return self.create(image, **kwargs)

    def get(self, name: str) -> Any:
        box = self._container
        return box if box is not None and name in (box.id, box.name) else FakeNetwork()

    def create_endpoint_config(self, aliases: list[str]) -> dict[str, Any]:
        return {"Aliases": aliases}

    def logs(self, ident: str, **_: Any) -> FakeLog:
        return FakeLog([b"INFO corral.boot: controller secret written\n"])


class FakeLog(list[bytes]):
    """A followed log that has said all it will."""

    def close(self) -> None:
        pass


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_proxy_state_is_its_uids_alone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root")
    manager = EgressManager(GatewaySettings(data_dir=tmp_path, egress_upstream_ca=None), runtime=None)  # type: ignore[arg-type]
    state, _ = manager.state.ground_state(SID)
    manager.state.claim_ground(state, ["example.test"], "enforce", None)
    client = FakeClient()
    runtime = DockerRuntime(client, proxy_uid=4321)  # type: ignore[arg-type]  # docker-py is untyped
    proxy = runtime.start_proxy(ProxySpec(SID, NETWORK, state, "corral-egress"))
    assert (runtime.proxy_uid, client.created["user"]) == (4321, "4321:4321")
    assert (proxy.name, proxy.address) == (proxy_name(SID), "10.213.0.2")
    assert client.created["volumes"] == {str(state): {"bind": "/var/lib/corral-egress", "mode": "rw"}}
    assert (state.stat().st_uid, _mode(state)) == (4321, 0o700)
    policy = state / "policy.json"
    assert (policy.stat().st_uid, policy.stat().st_gid, _mode(policy)) == (4321, 4321, 0o600)
    assert json.loads(policy.read_text()) == {"allow": ["example.test"], "mode": "enforce", "generation": 0}
    assert {p.stat().st_uid for p in state.rglob("*")} == {4321}  # the CA too
    manager.write_meta(SID, owner="key-a")
    assert _mode(state / "session.json") == 0o600
    assert _mode(tmp_path / "egress") == 0o700 or not (tmp_path / "egress").exists()


class RemappedClient(FakeClient):
    """An engine run with ``userns-remap``: its data root is named after the mapping."""

    def info(self) -> dict[str, Any]:
        return {"SecurityOptions": ["name=seccomp,profile=default", "name=userns"], "DockerRootDir": "/d/100000.100000"}


def test_under_userns_remap_the_proxy_state_is_the_remapped_uids(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root")
    manager = EgressManager(GatewaySettings(data_dir=tmp_path, egress_upstream_ca=None), runtime=None)  # type: ignore[arg-type]
    state, _ = manager.state.ground_state(SID)
    manager.state.claim_ground(state, ["example.test"], "enforce", None)
    client = RemappedClient()
    runtime = DockerRuntime(client, proxy_uid=4321)  # type: ignore[arg-type]  # docker-py is untyped
    runtime.start_proxy(ProxySpec(SID, NETWORK, state, "corral-egress"))
    # The container still runs as 4321; on the host that uid is 104321, which must own its state.
    assert (runtime.host_root, client.created["user"]) == (100000, "4321:4321")
    assert {p.stat().st_uid for p in [state, *state.rglob("*")]} == {104321}


@pytest.mark.parametrize(
    ("info", "root"),
    [
        ({"SecurityOptions": ["name=seccomp,profile=default"], "DockerRootDir": "/var/lib/docker"}, 0),
        ({"SecurityOptions": None, "DockerRootDir": "/var/lib/docker/231072.231072"}, 0),
        ({"SecurityOptions": ["name=userns"], "DockerRootDir": "/var/lib/docker/231072.231072"}, 231072),
    ],
)
def test_the_host_uid_of_a_containers_root_is_read_from_the_engines_mapping(info: dict[str, Any], root: int) -> None:
    assert remapped_root(info) == root


def test_a_remapping_engine_that_names_no_mapping_is_an_error() -> None:
    from corral.errors import SandboxError

    with pytest.raises(SandboxError, match="names no mapping"):
        remapped_root({"SecurityOptions": ["name=userns"], "DockerRootDir": "/var/lib/docker"})


def test_the_proxy_uid_defaults_to_1001_under_root_and_to_the_gateways_own_otherwise() -> None:
    assert default_proxy_uid(None, 0) == 1001
    assert default_proxy_uid(None, 1234) == 1234
    assert default_proxy_uid(4321, 0) == 4321
    expected = 1001 if os.geteuid() == 0 else os.geteuid()
    assert DockerRuntime(FakeClient()).proxy_uid == expected  # type: ignore[arg-type]


def test_a_proxy_uid_not_the_gateways_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.errors import SandboxError

    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    runtime = DockerRuntime(FakeClient(), proxy_uid=4321)  # type: ignore[arg-type]
    with pytest.raises(SandboxError, match="CORRAL_EGRESS_UID=4321 needs a gateway running as root"):
        runtime.ensure_egress_network("corral-egress")


def test_a_sandbox_behind_a_proxy_is_told_where_it_is_and_its_token_is_the_controllers(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root")
    token = tmp_path / "proxy-token"
    token.write_text("t")
    token.chmod(0o600)
    client = FakeClient()
    spec = SandboxSpec(name="corral-session-1", session_network=NETWORK, files={str(token): "/run/corral/proxy-token"})
    sandbox = DockerRuntime(client).start_sandbox(spec)  # type: ignore[arg-type]
    assert (sandbox.host, sandbox.secret) == ("10.213.0.2", "s3cret")
    assert client.created["network"] == NETWORK.name and "ports" not in client.created
    environment = client.created["environment"]
    assert environment["CORRAL_PROXY"] == "corral-proxy:8080"
    assert (environment["CORRAL_SESSION_NET"], environment["CORRAL_SESSION_GATEWAY"]) == ("10.213.0.0/28", "10.213.0.1")
    assert client.created["volumes"] == {str(token): {"bind": "/run/corral/proxy-token", "mode": "ro"}}
    assert (token.stat().st_uid, _mode(token)) == (CONTROLLER_UID, 0o600)


class MountingClient(FakeClient):
    """What Docker would find at each bound host path when it starts the container: read at ``run``."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, tuple[bytes, int, int]] = {}
        self.execs = 0

    def run(self, image: str, **kwargs: Any) -> FakeContainer:
        for host in kwargs["volumes"]:
            info = os.stat(host)
            self.found[host] = (Path(host).read_bytes(), info.st_uid, _mode(Path(host)))
        container = self.create(image, **kwargs)
        client = self

        def no_exec(argv: list[str], **_: Any) -> tuple[int, bytes]:
            client.execs += 1
            return 1, b""

        container.exec_run = no_exec  # type: ignore[method-assign]
        return container


def test_a_sandboxs_secret_is_made_for_its_start_and_mounted_for_the_controller_with_no_exec(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing a file to another uid needs root")
    client = MountingClient()
    runtime = DockerRuntime(client, handover_dir=tmp_path / "handover")  # type: ignore[arg-type]
    sandbox = runtime.start_sandbox(SandboxSpec(name="corral-session-2", session_network=NETWORK))
    assert client.created["environment"]["CORRAL_SECRET_GIVEN"] == "1"
    [(host, mount)] = client.created["volumes"].items()
    assert mount == {"bind": str(auth.SECRET_FILE), "mode": "ro"}
    content, uid, mode = client.found[host]
    assert (content, uid, mode) == (sandbox.secret.encode() + b"\n", CONTROLLER_UID, 0o400)
    assert len(sandbox.secret) >= 32
    assert client.execs == 0  # nothing read back from inside
    # On the host only while Docker mounts it: the start done, neither the file nor its directory stays.
    assert not Path(host).exists() and list((tmp_path / "handover").iterdir()) == []
    again = runtime.start_sandbox(SandboxSpec(name="corral-session-3", session_network=NETWORK))
    assert again.secret != sandbox.secret  # one per start


def test_a_given_secret_is_kept_out_of_its_repr(tmp_path: Path) -> None:
    given = GivenSecret("s3cret-given-at-start", tmp_path / "secret")
    assert "s3cret-given-at-start" not in repr(given) and "s3cret-given-at-start" not in str(given)


def test_a_restarted_gateway_removes_the_secrets_a_start_it_did_not_finish_left(tmp_path: Path) -> None:
    # A gateway killed between writing a start's secret and Docker's mount (SIGKILL, the OOM killer, a
    # power cut) never ran the start's clean-up: the next one removes what it left.
    handover = tmp_path / "handover"
    left = handover / "secret-abc123"
    left.mkdir(parents=True)
    (left / "secret").write_text("a sandbox's controller secret\n")
    (handover / "other").write_text("not a start's")
    DockerRuntime(FakeClient(), handover_dir=handover)  # type: ignore[arg-type]
    assert sorted(p.name for p in handover.iterdir()) == ["other"]


def test_without_a_directory_to_hand_it_over_the_secret_boot_made_is_read_back() -> None:
    client = FakeClient()
    sandbox = DockerRuntime(client).start_sandbox(SandboxSpec(name="corral-session-4", session_network=NETWORK))  # type: ignore[arg-type]
    assert sandbox.secret == "s3cret" and "CORRAL_SECRET_GIVEN" not in client.created["environment"]


@pytest.mark.parametrize("memory", ["256m", "512m", "768m", "1024m", "1536m", "2g", "4g", "16g"])
def test_the_agents_tmpfs_mounts_together_leave_the_headroom_of_the_memory_limit(memory: str) -> None:
    sizes = agent_tmpfs_mib(SandboxSpec(memory=memory, tmp_size="4g", workspace_size="8g", shm_size="256m"))
    assert set(sizes) == {"/tmp", "/home/agent", "/workspace", "/dev/shm"}
    assert all(size >= 16 for size in sizes.values())
    headroom = max(MIN_HEADROOM_MIB, mebibytes(memory) // 4)
    assert sum(sizes.values()) <= max(mebibytes(memory) - headroom, 64)  # a tiny session: each at its floor


def test_tmpfs_sizes_that_fit_are_kept_as_asked_and_the_options_use_them(tmp_path: Path) -> None:
    spec = SandboxSpec(memory="4g", tmp_size="512m", workspace_size="1g", shm_size="128m")
    assert agent_tmpfs_mib(spec) == {"/tmp": 512, "/home/agent": 512, "/workspace": 1024, "/dev/shm": 128}
    options = sandbox_options(spec)
    assert "size=512m," in options["tmpfs"]["/tmp"] and "size=1024m," in options["tmpfs"]["/workspace"]
    assert options["shm_size"] == "128m" and options["mem_limit"] == "4g"
    small = sandbox_options(SandboxSpec(memory="1024m"))
    assert "size=99m," in small["tmpfs"]["/tmp"] and "size=57m," in small["tmpfs"]["/home/agent"]


def test_a_size_is_read_as_docker_writes_it() -> None:
    assert [mebibytes(text) for text in ("2g", "512m", "1024k", str(3 << 20), "1G")] == [2048, 512, 1, 3, 1024]
    with pytest.raises(ValueError):
        mebibytes("lots")


def test_a_sessions_objects_are_named_from_its_id() -> None:
    assert (session_network_name(SID), proxy_name(SID)) == (f"corral-net-{SID}", f"corral-egress-{SID}")


class GoneNetworks(FakeClient):
    def get(self, name: str) -> Any:
        import docker.errors

        raise docker.errors.NotFound(f"network {name} not found")


def test_removing_a_network_already_gone_still_drops_the_guards_left_on_no_interface(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A network gone (removed by hand, or by a crashed gateway's half teardown) leaves no bridge name
    to remove the guard of: the guards of every interface that is gone go instead, so none is left."""
    swept: list[bool] = []
    monkeypatch.setattr("corral.runtime.hostguard.remove_stale", lambda: swept.append(True) or ["br-gone"])
    DockerRuntime(GoneNetworks()).remove_network(NETWORK.name)  # type: ignore[arg-type]
    assert swept == [True]


def test_an_unshared_proxy_gets_its_seed_read_only_and_its_state_on_its_own_tmpfs(tmp_path: Path) -> None:
    """The tests' stand-in for the swarm: the gateway's state directory is never mounted, and stays
    the gateway's; the proxy starts from a seed of it."""
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root")
    manager = EgressManager(GatewaySettings(data_dir=tmp_path, egress_upstream_ca=None), runtime=None)  # type: ignore[arg-type]
    state, _ = manager.state.ground_state(SID)
    manager.state.claim_ground(state, ["example.test"], "enforce", None)
    client = FakeClient()
    runtime = DockerRuntime(client, proxy_uid=4321, shares_proxy_state=False)  # type: ignore[arg-type]
    runtime.start_proxy(ProxySpec(SID, NETWORK, state, "corral-egress"))
    seed_dir = state.with_name(state.name + ".seed")
    assert client.created["volumes"] == {str(seed_dir): {"bind": "/run/corral-seed", "mode": "ro"}}
    assert client.created["tmpfs"]["/var/lib/corral-egress"].endswith("mode=0700,uid=4321,gid=4321")
    assert client.created["environment"]["CORRAL_SEED_DIR"] == "/run/corral-seed"
    assert {p.stat().st_uid for p in [state, *state.rglob("*")]} == {os.geteuid()}  # the gateway's still
    assert {p.stat().st_uid for p in [seed_dir, *seed_dir.rglob("*")]} == {4321}
    assert runtime.shares_proxy_state is False and DockerRuntime(FakeClient()).shares_proxy_state is True  # type: ignore[arg-type]
    manifest = {f.path for f in parse_manifest((seed_dir / "corral-seed.json").read_bytes())}
    assert manifest == {"ca/mitmproxy-ca.pem", "ca/mitmproxy-ca-cert.pem", "policy.json"}
