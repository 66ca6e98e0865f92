"""A runtime in memory: every operation of :class:`~corral.runtime.SandboxRuntime` and nothing
more (test_seam.py holds it to that), checked against the Protocol by mypy (pyproject's ``files``).
The gateway's unit tests run their sessions on it; what they steer or inspect is plain attributes."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from corral.runtime import (
    ExitInfo,
    ProxyAddress,
    ProxySpec,
    SandboxAddress,
    SandboxInfo,
    SandboxRuntime,
    SandboxSpec,
    SessionNetwork,
    State,
)


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


class FakeRuntime:
    def __init__(self) -> None:
        self.running: dict[str, tuple[SandboxAddress, dict[str, str]]] = {}
        self.exited: dict[str, ExitInfo] = {}  # sandbox id -> how it died (still listed, not running)
        self.networks: dict[str, SessionNetwork] = {}
        self.network_labels: dict[str, dict[str, str]] = {}
        self.guarded: set[str] = set()  # the networks with a host guard
        self.proxies: dict[str, tuple[ProxyAddress, dict[str, str], State]] = {}  # by session id
        self.fail_remove = False
        self._n = 0

    # -- shared networks -------------------------------------------------------------------------------

    def ensure_sandbox_network(self, name: str) -> bool:
        self.guarded.add(name)
        return True

    def ensure_egress_network(self, name: str) -> bool:
        self.guarded.add(name)
        return True

    def remove_stale_guards(self) -> list[str]:
        return []

    # -- session networks ------------------------------------------------------------------------------

    def create_session_network(self, session_id: str, labels: Mapping[str, str], subnets: str) -> SessionNetwork:
        subnet = list(ipaddress.IPv4Network(subnets).subnets(new_prefix=28))[len(self.networks)]
        network = SessionNetwork(f"net-{session_id}", str(subnet), str(subnet[1]))
        self.networks[network.name] = network
        self.network_labels[network.name] = {**labels, "corral.session": session_id}
        self.guarded.add(network.name)
        return network

    def session_networks(self, labels: Mapping[str, str]) -> list[SessionNetwork]:
        return [net for name, net in self.networks.items() if _matches(self.network_labels[name], labels)]

    def remove_session_network(self, network: SessionNetwork) -> None:
        self.networks.pop(network.name, None)
        self.guarded.discard(network.name)

    # -- sandboxes -------------------------------------------------------------------------------------

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        self._n += 1
        box = SandboxAddress(f"c{self._n}", spec.name or f"c{self._n}", f"10.99.0.{self._n + 1}", 8765)
        self.running[box.id] = (box, dict(spec.labels or {}))
        return box

    def wait_ready(self, sandbox: SandboxAddress, timeout_s: float = 60.0) -> float:
        return 0.0

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        wanted = dict(labels or {})
        return [SandboxInfo(b.id, b.name, lab, True, b) for b, lab in self.running.values() if _matches(lab, wanted)]

    def remove(self, ident: str) -> None:
        if self.fail_remove:
            raise RuntimeError("the runtime said no")
        self.running.pop(ident, None)
        self.exited.pop(ident, None)

    # -- liveness --------------------------------------------------------------------------------------

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        return {
            box.id: ("exited" if box.id in self.exited else "running")
            for box, lab in self.running.values()
            if _matches(lab, labels)
        }

    def exit_info(self, ident: str) -> ExitInfo | None:
        if ident not in self.running:
            return ExitInfo("gone", None, False)
        return self.exited.get(ident)

    # -- egress pairs ----------------------------------------------------------------------------------

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        proxy = ProxyAddress(f"p-{spec.session_id}", f"proxy-{spec.session_id}", "127.0.0.1")
        self.proxies[spec.session_id] = (proxy, {**(spec.labels or {}), "corral.session": spec.session_id}, "running")
        return proxy

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, State]:
        return {sid: state for sid, (_, lab, state) in self.proxies.items() if _matches(lab, labels)}

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        proxy, labels, _ = self.proxies[session_id]
        self.proxies[session_id] = (proxy, labels, "running")
        return proxy

    def stop_proxy(self, session_id: str) -> None:
        proxy, labels, _ = self.proxies[session_id]
        self.proxies[session_id] = (proxy, labels, "exited")

    def proxy_logs(self, session_id: str, tail: int = 100) -> str:
        return ""

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        self.proxies.pop(session_id, None)
        self.remove_session_network(SessionNetwork(f"net-{session_id}", "", ""))

    # -- what tests do to it ---------------------------------------------------------------------------

    def die(self, ident: str, info: ExitInfo) -> None:
        self.exited[ident] = info


def as_runtime(fake: FakeRuntime) -> SandboxRuntime:
    """Where mypy proves the fake is a whole SandboxRuntime (a missing or mistyped method fails here)."""
    return fake
