"""The session side's calls to sandboxes' controllers, on one kept-alive client: whether one answers,
its secrets' placeholders, its boot id. Each call signed and its answer proven (corral.gateway.controller)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from corral.errors import SandboxUnreachable
from corral.gateway import controller
from corral.gateway.vitals import controller_boot
from corral.runtime import SandboxAddress

PLACEHOLDERS_TIMEOUT_S = 2.0  # the watchdog's look at a controller's placeholders: one round, not the loop


class Controllers:
    """Open between the gateway's start and stop; ``transport`` None is the network (a test gives its
    fake controllers here)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._transport = transport
        self._http: httpx.AsyncClient | None = None

    @property
    def opened(self) -> bool:
        return self._http is not None

    @property
    def http(self) -> httpx.AsyncClient:
        """The client (the recorder follows controllers' events on it too)."""
        assert self._http is not None, "the controllers' client opens with the gateway's start"
        return self._http

    def open(self) -> None:
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0), transport=self._transport)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def answers(self, sandbox: SandboxAddress, timeout_s: float) -> None:
        """Its controller, the one of this boot, answers now (one signed request, proven by the
        per-boot secret; no thread, no screen grab). Raises SandboxError."""
        try:
            response = await controller.request(
                self.http, sandbox.base_url, sandbox.secret, "GET", "/v1/secrets", timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"sandbox {sandbox.name} did not answer: {exc}") from None
        if response.status_code != 200:
            raise SandboxUnreachable(f"sandbox {sandbox.name} answered {response.status_code}")

    async def boot(self, sandbox: SandboxAddress) -> str | None:
        """Its boot id (corral.gateway.vitals.controller_boot); None when it does not answer well."""
        return await controller_boot(self.http, sandbox)

    async def put_placeholders(self, sandbox: SandboxAddress, placeholders: dict[str, str]) -> None:
        try:
            response = await controller.request(
                self.http, sandbox.base_url, sandbox.secret, "PUT", "/v1/secrets", json={"secrets": placeholders}
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the controller of {sandbox.name} did not take its secrets: {exc}") from None
        if response.status_code >= 300:
            raise SandboxUnreachable(
                f"the controller of {sandbox.name} refused its secrets' placeholders ({response.status_code})"
            )

    async def put_env(self, sandbox: SandboxAddress, env: Mapping[str, str]) -> None:
        """The session's environment variables, the whole set (the controller checks them again)."""
        try:
            response = await controller.request(
                self.http, sandbox.base_url, sandbox.secret, "PUT", "/v1/env", json={"env": dict(env)}
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the controller of {sandbox.name} did not take its env: {exc}") from None
        if response.status_code >= 300:
            raise SandboxUnreachable(f"the controller of {sandbox.name} refused its env ({response.status_code})")

    async def env_digest(self, sandbox: SandboxAddress) -> str | None:
        """The digest of the env the controller holds (corral.contracts.envvars.digest); None when it
        cannot say (an older image)."""
        held = await self._shown(sandbox, "/v1/env", "digest", "its env")
        return held if isinstance(held, str) else None

    async def placeholders(self, sandbox: SandboxAddress) -> dict[str, str] | None:
        """The placeholders the controller holds; None when it cannot say (an older image)."""
        held = await self._shown(sandbox, "/v1/secrets", "secrets", "its secrets")
        return {str(k): str(v) for k, v in held.items()} if isinstance(held, dict) else None

    async def _shown(self, sandbox: SandboxAddress, path: str, field: str, what: str) -> object:
        """One field of what a controller's ``GET path`` answers (None for anything but a 200 JSON
        object); SandboxUnreachable when it does not answer."""
        try:
            response = await controller.request(
                self.http, sandbox.base_url, sandbox.secret, "GET", path, timeout=PLACEHOLDERS_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the controller of {sandbox.name} did not show {what}: {exc}") from None
        try:
            return response.json().get(field) if response.status_code == 200 else None
        except (ValueError, AttributeError):
            return None
