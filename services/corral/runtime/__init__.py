"""Where sandboxes run. :class:`SandboxRuntime` is what the control plane needs of a runtime;
:mod:`corral.runtime.docker` implements it and is the only module that talks to Docker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from corral.runtime.docker import SandboxContainer, SandboxInfo, SandboxSpec


class SandboxRuntime(Protocol):
    """Start, find and remove sandboxes (a Kubernetes driver would implement the same)."""

    def ensure_network(self, name: str) -> None: ...

    def bridge(self, name: str) -> tuple[str, str]: ...

    def start_sandbox(self, spec: SandboxSpec) -> SandboxContainer: ...

    def wait_ready(self, sandbox: SandboxContainer, timeout_s: float = 60.0) -> float: ...

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]: ...

    def remove(self, ident: str) -> None: ...
