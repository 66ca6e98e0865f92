"""What the session side asks of egress (:class:`EgressPort`), and :class:`NullEgress`, the egress of a
gateway that runs without egress control (``CORRAL_EGRESS=0``): it holds nothing and does nothing, so
the session side never asks whether egress is on. A session's own pair says whether it has a proxy
(``Pair.egress``, ``Session.egress``); only the wiring (corral.gateway.app) chooses the egress.

:class:`~corral.gateway.egress.EgressManager` satisfies the port as it is; starting a pair (network,
CA, proxy) is not in it: that is the pair starter's (corral.gateway.sessions.starts), which only a gateway with
egress control has.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from corral.contracts.control import GatewayEvent
from corral.errors import EgressUnavailable
from corral.gateway.egress import Egress
from corral.gateway.secrets import SecretSet, SecretVault
from corral.runtime import State

NO_EGRESS = "this gateway runs sessions without egress control"


class EgressPort(Protocol):
    """The egress calls of the session side: sessions' proxies and their archive."""

    @property
    def vault(self) -> SecretVault: ...

    async def start(self) -> bool: ...

    def responses_path(self, session_id: str) -> Path | None: ...

    def teardown_blocking(self, egress: Egress, anchor: bool = True) -> None: ...

    def forget_blocking(self, session_id: str) -> None: ...

    def pause_blocking(self, egress: Egress) -> None: ...

    def resume_blocking(self, egress: Egress) -> Egress: ...

    def sandbox_side(self, egress: Egress) -> tuple[dict[str, str], dict[str, str]]: ...

    async def wait_ready(self, egress: Egress, timeout_s: float) -> None: ...

    def write_meta(self, session_id: str, **fields: object) -> None: ...

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> object: ...

    async def set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> object: ...

    async def report(self, egress: Egress, message: GatewayEvent) -> None: ...

    async def revive(
        self, egresses: list[Egress], states: Mapping[str, State] | None = None
    ) -> tuple[dict[str, Egress], list[str]]: ...

    def prune(self, retention_s: float, live: set[str]) -> int: ...

    async def mirror_now(self, session_id: str, egress: Egress | None) -> None: ...


class NullEgress:
    """No egress control: no proxies, no archive, no secrets. What would change a proxy raises
    EgressUnavailable (no session of this gateway has one to change)."""

    def __init__(self) -> None:
        self._vault = SecretVault()  # what recovery adopts only: nothing here ever sets secrets on a proxy

    @property
    def vault(self) -> SecretVault:
        return self._vault

    async def start(self) -> bool:
        return True  # no egress network: nothing of it for the host guard to hold

    def responses_path(self, session_id: str) -> Path | None:
        return None

    def teardown_blocking(self, egress: Egress, anchor: bool = True) -> None:
        return None

    def forget_blocking(self, session_id: str) -> None:
        return None

    def write_meta(self, session_id: str, **fields: object) -> None:
        return None

    def pause_blocking(self, egress: Egress) -> None:
        return None  # no session of this gateway has a proxy

    def resume_blocking(self, egress: Egress) -> Egress:
        raise EgressUnavailable(NO_EGRESS)

    def sandbox_side(self, egress: Egress) -> tuple[dict[str, str], dict[str, str]]:
        raise EgressUnavailable(NO_EGRESS)

    async def wait_ready(self, egress: Egress, timeout_s: float) -> None:
        raise EgressUnavailable(NO_EGRESS)

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> object:
        raise EgressUnavailable(NO_EGRESS)

    async def set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> object:
        raise EgressUnavailable(NO_EGRESS)

    async def report(self, egress: Egress, message: GatewayEvent) -> None:
        return None  # no audit chain to report to

    async def revive(
        self, egresses: list[Egress], states: Mapping[str, State] | None = None
    ) -> tuple[dict[str, Egress], list[str]]:
        return {}, []

    def prune(self, retention_s: float, live: set[str]) -> int:
        return 0

    async def mirror_now(self, session_id: str, egress: Egress | None) -> None:
        return None  # no proxy state to copy
