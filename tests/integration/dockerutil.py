"""What only the tests and the bench do to Docker, beside the runtime: run a command inside a
sandbox, kill and restart containers behind the gateway's back, fake upstreams, look at networks.

The gateway never calls any of this; :class:`DockerHarness` adds it to the real driver so a test
holds one object for both."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import docker.errors
from docker.models.containers import Container

from corral.errors import SandboxError
from corral.runtime import SandboxAddress, SessionNetwork
from corral.runtime.docker import SECRET_WAIT_S, DockerRuntime
from corral.runtime.docker.networks import session_network_of
from corral.runtime.docker.sandboxes import controller_address


class DockerHarness(DockerRuntime):
    # -- inside a container ----------------------------------------------------------------------------

    def exec(self, ident: str, argv: list[str], user: str = "corral") -> tuple[int, str]:
        environment = {"DISPLAY": ":0"}
        if user != "root":
            # docker exec leaves the container's capability bounding set even to a non-root user; start
            # as root and drop to the user with nothing left, as the sandbox's own processes run.
            argv = [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--clear-groups",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all",
                "--",
                *argv,
            ]
            environment["HOME"] = f"/home/{user}"
            # The X server's cookies (corral.sandbox.display.xaccess): the controller's trusted, the agent's not.
            if user in ("corral", "agent"):
                environment["XAUTHORITY"] = f"/run/corral/x11/{'controller' if user == 'corral' else 'agent'}"
        code, output = self._container(ident).exec_run(argv, user="root", environment=environment)
        return int(code), output.decode(errors="replace")

    def kill_process(self, ident: str, process_name: str, user: str = "browser") -> None:
        """Kill a process inside the sandbox by name, as its own uid (root there holds no CAP_KILL);
        tests use it to crash Chromium, which runs as the browser's uid."""
        self.exec(ident, ["pkill", "-KILL", "-x", process_name], user=user)

    def cpu_seconds(self, ident: str) -> float:
        """CPU time the container has used so far (docker stats' counter), for the bench's CPU windows."""
        stats: dict[str, Any] = self._container(ident).stats(stream=False, one_shot=True)
        return int(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9

    # -- containers behind the gateway's back ----------------------------------------------------------

    def find(self, name: str) -> SandboxAddress | None:
        try:
            container: Container = self.client.containers.get(name)
        except docker.errors.NotFound:
            return None
        address = controller_address(container)
        return self.read_secret(address, SECRET_WAIT_S) if address is not None else None

    def kill(self, ident: str, signal: str = "KILL") -> None:
        """Kill a container's main process (a proxy or a sandbox mid-session)."""
        with contextlib.suppress(docker.errors.APIError):
            self._container(ident).kill(signal=signal)

    def stop(self, ident: str) -> None:
        """Stop a container for good (Docker does not restart a container stopped by hand)."""
        with contextlib.suppress(docker.errors.APIError):
            self._container(ident).stop(timeout=1)

    def restart(self, ident: str) -> None:
        self._container(ident).restart(timeout=2)

    def container_states(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Name -> state ("running", "exited", "restarting", ...) of every container with ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        # One listing, no inspect per container: a container removed between the two (a session's
        # teardown meanwhile) made the high-level list raise NotFound.
        listed = self.client.api.containers(all=True, filters=filters)
        return {str(c["Names"][0]).lstrip("/"): str(c["State"]) for c in listed}

    def address_on(self, ident: str, network: str) -> str | None:
        """A container's address on one network (None when it has none there)."""
        networks = (self._container(ident).attrs.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(network) or {}).get("IPAddress")
        return str(address) if address else None

    def start_service(
        self,
        name: str,
        image: str,
        argv: list[str],
        network: str,
        aliases: list[str],
        volumes: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        *,
        writable: Mapping[str, str] | None = None,
        cpus: float | None = None,
        memory: str | None = None,
    ) -> str:
        """A helper container (tests' fake upstreams, the bench's); returns its address on ``network``.

        ``volumes`` are mounted read-only, ``writable`` read-write; ``cpus`` and ``memory`` limit it
        (the bench gives its bare proxy the same limits as a session's proxy)."""
        self.remove(name)
        binds = {host: {"bind": inside, "mode": "ro"} for host, inside in volumes.items()}
        binds.update({host: {"bind": inside, "mode": "rw"} for host, inside in (writable or {}).items()})
        limits: dict[str, Any] = {}
        if cpus is not None:
            limits["nano_cpus"] = int(cpus * 1e9)
        if memory is not None:
            limits.update(mem_limit=memory, memswap_limit=memory)
        try:
            container: Container = self.client.containers.create(
                image,
                argv,
                entrypoint=[],
                name=name,
                user="root",
                labels=dict(labels or {}),
                network=network,
                volumes=binds,
                init=True,
                **limits,
            )
            net = self.client.networks.get(network)
            net.disconnect(container)
            net.connect(container, aliases=aliases)
            container.start()
            container.reload()
        except docker.errors.APIError as exc:
            self.remove(name)
            raise SandboxError(f"cannot start {name}: {exc.explanation or exc}") from None
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        return str((networks.get(network) or {}).get("IPAddress", ""))

    # -- networks --------------------------------------------------------------------------------------

    def network_names(self) -> list[str]:
        return [str(network.name) for network in self.client.networks.list()]

    def session_network(self, name: str) -> SessionNetwork | None:
        try:
            return session_network_of(self.client.networks.get(name).attrs)
        except docker.errors.NotFound:
            return None

    def interface(self, name: str) -> str:
        """The host interface of a bridge network (what the host guard's rules name)."""
        attrs = self.client.networks.get(name).attrs
        options = attrs.get("Options") or {}
        return str(options.get("com.docker.network.bridge.name") or f"br-{str(attrs['Id'])[:12]}")

    def bridge(self, name: str) -> tuple[str, str]:
        """The host interface and gateway address of a bridge network."""
        configs = (self.client.networks.get(name).attrs.get("IPAM") or {}).get("Config") or [{}]
        return self.interface(name), str(configs[0].get("Gateway", ""))
