"""``sb.previews``: a server the agent runs inside the sandbox, reachable from outside through the
gateway on an origin of its own (docs/previews.md), in each twin; ``get_host`` names its host as
E2B's ``Sandbox.get_host`` does.

Each call is one request of the gateway's HTTP API (:mod:`corral.gateway_client`) with the owner's
API key: a session's own token is refused (403), so an agent holding only its token cannot open its
sandbox to the world.
"""

from __future__ import annotations

import os

from corral.contracts.previews import host_name
from corral.errors import InvalidRequest
from corral.gateway_client import AsyncGateway, Gateway
from corral.gateway_models import Preview, PreviewInfo, RevokedPreview

DEFAULT_DOMAIN = "localhost"


def checked_port(port: int) -> int:
    """A TCP port (1..65535), refused here as the gateway would refuse it (``invalid_field``)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidRequest(f"port must be a TCP port, 1 to 65535, not {port!r}", field="port")
    return port


def preview_host(session_id: str, port: int, domain: str | None = None) -> str:
    """``{port}-{session hex}.{domain}``: the host name the gateway serves a preview of ``port`` on.
    ``domain``: else ``$CORRAL_PREVIEW_DOMAIN`` (the gateway's setting of that name), else ``localhost``."""
    where = domain or os.environ.get("CORRAL_PREVIEW_DOMAIN") or DEFAULT_DOMAIN
    return host_name(checked_port(port), session_id, where.strip(".").lower())


class Previews:
    """``sb.previews``: the session's port previews (the owner's API key only)."""

    def __init__(self, gateway: Gateway, session_id: str) -> None:
        self._gateway = gateway
        self._id = session_id

    def create(self, port: int, *, ttl_s: int | None = None) -> Preview:
        """A preview of ``port`` (a server listening on it inside the sandbox, any address): its
        ``url`` carries the secret, shown this once; ``ttl_s`` its life (the gateway's default is an
        hour; at most a day, and never past the session's end). Its ``sandbox_url`` is the address
        the sandbox's own browser opens (no secret asked there)."""
        return self._gateway.create_preview(self._id, checked_port(port), ttl_s)

    def list(self) -> list[PreviewInfo]:
        """The session's previews, live, expired and revoked, with their use (connections, bytes);
        never their secrets."""
        return self._gateway.previews(self._id)

    def revoke(self, preview_id: str) -> RevokedPreview:
        """The preview's secret refused from now on; its open connections (WebSockets too) closed."""
        return self._gateway.revoke_preview(self._id, preview_id)


class AsyncPreviews:
    """The async twin of :class:`Previews`."""

    def __init__(self, gateway: AsyncGateway, session_id: str) -> None:
        self._gateway = gateway
        self._id = session_id

    async def create(self, port: int, *, ttl_s: int | None = None) -> Preview:
        """A preview of ``port`` (see :meth:`Previews.create`): its ``url`` carries the secret, once."""
        return await self._gateway.create_preview(self._id, checked_port(port), ttl_s)

    async def list(self) -> list[PreviewInfo]:
        """The session's previews, with their use; never their secrets."""
        return await self._gateway.previews(self._id)

    async def revoke(self, preview_id: str) -> RevokedPreview:
        """The preview's secret refused from now on; its open connections closed."""
        return await self._gateway.revoke_preview(self._id, preview_id)


__all__ = ["AsyncPreviews", "Previews", "checked_port", "preview_host"]
