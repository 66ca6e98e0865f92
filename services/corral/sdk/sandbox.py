"""The twins, :class:`Sandbox` and :class:`AsyncSandbox`: a session's life (create, attach, close,
delete) and its egress (allowlist, secrets, traffic); the vocabulary comes from their parts, one
per concern (:mod:`corral.sdk.screen`, :mod:`~corral.sdk.browser`, :mod:`~corral.sdk.control`,
:mod:`~corral.sdk.execs`, :mod:`~corral.sdk.code`, :mod:`~corral.sdk.vendor`), each a twin pair too."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Self

import httpx

from corral.client import AsyncSandboxClient, SandboxClient
from corral.errors import GatewayError
from corral.gateway_client import AsyncGateway, Gateway, secret_change, session_body
from corral.gateway_models import ProfileInfo, SecretChange, SessionInfo, TrafficRecord
from corral.sdk.browser import AsyncBrowser, Browser
from corral.sdk.code import AsyncCode, Code
from corral.sdk.control import AsyncControl, Control
from corral.sdk.downloads import AsyncDownloads, Downloads
from corral.sdk.execs import AsyncExecs, Execs
from corral.sdk.pending import Pending
from corral.sdk.previews import AsyncPreviews, Previews, preview_host
from corral.sdk.screen import AsyncScreen, Screen
from corral.sdk.vendor import AsyncVendor, Vendor


class Sandbox(Vendor, Screen, Browser, Control, Execs, Code):
    """A session with its own WebSocket; deleted when the ``with`` block ends."""

    def __init__(self, info: SessionInfo, token: str, gateway: Gateway) -> None:
        self.info = info
        self.id = info.id
        self._gateway = gateway
        self._token = token
        self._ws = SandboxClient(f"{info.ws_url}?token={token}")
        self._ws.__enter__()

    @classmethod
    def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
        secrets: Mapping[str, SecretChange] | None = None,
        env: Mapping[str, str] | None = None,
        volume: str | None = None,
        template: str | None = None,
        profile: str | None = None,
        save_profile: bool = False,
        idle_action: str | None = None,
    ) -> Sandbox:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay. ``secrets``: name ->
        ``{"value": ..., "allow": [...], "in": [...]}``; the sandbox gets placeholders (:attr:`secrets`)
        and its proxy puts the values into requests to the bound hosts. ``env``: name -> value, in every
        command's environment (the agent reads them: never a secret's value). ``volume``: a workspace
        volume of this key's (``Gateway.create_volume``), mounted at /workspace for this session alone.
        ``template``: ``NAME`` or ``NAME:VERSION``, a template to start from (docs/environments.md).
        ``profile``: a saved browser profile (cookies, local storage, IndexedDB) loaded into the browser;
        ``save_profile``: saved again at the session's end (made at the first save when there is none yet).
        ``idle_action="pause"``: an idle timeout pauses the session rather than ending it."""
        gateway = Gateway(url, api_key)
        info: SessionInfo | None = None
        try:
            upload = None if hermetic_responses is None else gateway.upload_responses(hermetic_responses)
            try:
                body = session_body(
                    allow,
                    viewport,
                    timeout_s,
                    idle_timeout_s,
                    labels,
                    egress_mode,
                    upload,
                    secrets,
                    env=env,
                    volume=volume,
                    template=template,
                    idle_action=idle_action,
                    profile=profile,
                    save_profile=save_profile,
                )
                info = gateway.create_session(body)
            finally:
                if upload is not None:  # the session keeps its own copy
                    with contextlib.suppress(httpx.HTTPError):
                        gateway.delete_upload(upload)
            return cls(info, info.token or "", gateway)
        except BaseException:
            if info is not None:  # created, but the WebSocket failed: do not leave it running
                with contextlib.suppress(httpx.HTTPError, GatewayError):
                    gateway.delete_session(info.id)
            gateway.close()
            raise

    @classmethod
    def attach(cls, session_id: str, token: str, *, url: str | None = None) -> Sandbox:
        """Open an existing session with its token; :meth:`close` leaves it running."""
        gateway = Gateway(url, token)
        try:
            return cls(gateway.session(session_id), token, gateway)
        except BaseException:
            gateway.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def close(self) -> None:
        """Drop the connection and keep the session running."""
        self._ws.__exit__(None, None, None)
        self._gateway.close()

    def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        self._ws.__exit__(None, None, None)
        try:
            self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return self.info.container

    @property
    def node(self) -> str:
        """The machine the sandbox runs on (a Swarm node's host name; "" on a single-host gateway)."""
        return self.info.node

    # -- egress ----------------------------------------------------------------------------------------

    def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info.allow)

    @property
    def secrets(self) -> dict[str, str]:
        """The session's secrets as the sandbox holds them: name -> placeholder (never a value)."""
        return dict(self.info.secrets)

    # -- lifetime --------------------------------------------------------------------------------------

    def set_timeout(self, seconds: int) -> float:
        """The session now ends ``seconds`` from now (longer or shorter than before; at most the
        gateway's CORRAL_MAX_TIMEOUT_S): its new expiry, a Unix time (also in ``info.expires_at``)."""
        self.info = self._gateway.set_timeout(self.id, seconds)
        return self.info.expires_at

    def set_secret(
        self,
        name: str,
        value: str | None = None,
        *,
        allow: Sequence[str] | None = None,
        in_: Sequence[str] | None = None,
    ) -> str:
        """Add a secret (value and allow) or change one (what is given); needs the owner's API key.
        Returns its placeholder, which stays the same for the session's life."""
        self.info = self._gateway.update_secrets(self.id, {name: secret_change(value, allow, in_)})
        return self.secrets[name]

    def revoke_secret(self, name: str) -> None:
        """The proxy stops putting the secret in; its placeholder is refused from then on."""
        self.info = self._gateway.update_secrets(self.id, {name: None})

    def pause(self) -> SessionInfo:
        """Pause the session (E2B's ``pause``): its tabs, ``/workspace`` and ``/home/agent`` saved, its
        sandbox removed and its slot freed; the connection closes until :meth:`resume`."""
        self._ws.__exit__(None, None, None)
        self.info = self._gateway.pause_session(self.id)
        return self.info

    def resume(self, secrets: Mapping[str, str] | None = None) -> SessionInfo:
        """Resume a paused session: the same id and token, its files and tabs back, connected again.
        ``secrets``: values a restarted gateway no longer holds (it names them otherwise)."""
        self.info = self._gateway.resume_session(self.id, secrets)
        self._ws = SandboxClient(f"{self.info.ws_url}?token={self._token}")
        self._ws.__enter__()
        return self.info

    def traffic(self, **filters: str) -> list[TrafficRecord]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return self._gateway.traffic(self.id, **filters)

    def save_profile(self) -> ProfileInfo:
        """Save the browser's cookies, local storage and IndexedDB now under the profile the session
        was created with (Chromium restarts for the copy: open pages are closed)."""
        return self._gateway.save_profile(self.id)

    # -- port previews (docs/previews.md) -------------------------------------------------------------

    @property
    def previews(self) -> Previews:
        """The session's port previews: ``create(port, ttl_s=...)`` (its URL with the secret, once),
        ``list()``, ``revoke(id)``; the owner's API key only."""
        return Previews(self._gateway, self.id)

    @property
    def downloads(self) -> Downloads:
        """What the session's browser downloaded, whoever started it (docs/downloads.md): ``list()``,
        ``get(id)``, ``read(id)``, ``save(id, path)``, ``wait(url=..., name=..., since=...)``."""
        return Downloads(self._gateway, self.id)

    def get_host(self, port: int) -> str:
        """The host name a preview of ``port`` is served on (E2B's ``get_host``): ``{port}-{hex}.localhost``
        (the domain: ``$CORRAL_PREVIEW_DOMAIN``), on the gateway's preview port. A name, not access:
        the URL with its secret comes from ``previews.create(port)``."""
        return preview_host(self.id, port)


class AsyncSandbox(AsyncVendor, AsyncScreen, AsyncBrowser, AsyncControl, AsyncExecs, AsyncCode):
    """The async twin of :class:`Sandbox`: ``async with AsyncSandbox.create(...) as sb``."""

    def __init__(self, info: SessionInfo, token: str, gateway: AsyncGateway) -> None:
        self.info = info
        self.id = info.id
        self._gateway = gateway
        self._token = token
        self._ws = AsyncSandboxClient(f"{info.ws_url}?token={token}")  # opened by create/attach

    @classmethod
    def create(
        cls,
        allow: Sequence[str] | None = None,
        *,
        viewport: tuple[int, int] | None = None,
        timeout_s: int | None = None,
        idle_timeout_s: int | None = None,
        labels: dict[str, str] | None = None,
        egress_mode: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        hermetic_responses: bytes | None = None,
        secrets: Mapping[str, SecretChange] | None = None,
        env: Mapping[str, str] | None = None,
        volume: str | None = None,
        template: str | None = None,
        profile: str | None = None,
        save_profile: bool = False,
        idle_action: str | None = None,
    ) -> Pending[AsyncSandbox]:
        """A new session. With ``hermetic_responses`` (a recording's ``responses.mitm``) its proxy
        answers only from those and has no route out: a hermetic replay. ``secrets``: name ->
        ``{"value": ..., "allow": [...], "in": [...]}``; the sandbox gets placeholders (:attr:`secrets`)
        and its proxy puts the values into requests to the bound hosts. ``env``: name -> value, in every
        command's environment (the agent reads them: never a secret's value). ``volume``: a workspace
        volume of this key's (``Gateway.create_volume``), mounted at /workspace for this session alone.
        ``template``: ``NAME`` or ``NAME:VERSION``, a template to start from (docs/environments.md).
        ``profile``: a saved browser profile (cookies, local storage, IndexedDB) loaded into the browser;
        ``save_profile``: saved again at the session's end (made at the first save when there is none yet).
        ``idle_action="pause"``: an idle timeout pauses the session rather than ending it.

        Await it (``sb = await AsyncSandbox.create()``) or enter it (``async with AsyncSandbox.create()
        as sb``: the session ends with the block), as E2B's; ``async with await`` works as before."""

        async def start() -> AsyncSandbox:
            gateway = AsyncGateway(url, api_key)
            info: SessionInfo | None = None
            try:
                upload = None if hermetic_responses is None else await gateway.upload_responses(hermetic_responses)
                try:
                    body = session_body(
                        allow,
                        viewport,
                        timeout_s,
                        idle_timeout_s,
                        labels,
                        egress_mode,
                        upload,
                        secrets,
                        env=env,
                        volume=volume,
                        template=template,
                        idle_action=idle_action,
                        profile=profile,
                        save_profile=save_profile,
                    )
                    info = await gateway.create_session(body)
                finally:
                    if upload is not None:  # the session keeps its own copy
                        with contextlib.suppress(httpx.HTTPError):
                            await gateway.delete_upload(upload)
                sandbox = cls(info, info.token or "", gateway)
                await sandbox._ws.__aenter__()
                return sandbox
            except BaseException:
                if info is not None:  # created, but the WebSocket failed: do not leave it running
                    with contextlib.suppress(httpx.HTTPError, GatewayError):
                        await gateway.delete_session(info.id)
                await gateway.close()
                raise

        return Pending(start)

    @classmethod
    def attach(cls, session_id: str, token: str, *, url: str | None = None) -> Pending[AsyncSandbox]:
        """Open an existing session with its token; :meth:`close` leaves it running (leaving an
        ``async with`` block ends it, as for :meth:`create`). Awaited or entered, as :meth:`create`."""
        return Pending(lambda: cls._attach(session_id, token, url))

    @classmethod
    async def _attach(cls, session_id: str, token: str, url: str | None) -> AsyncSandbox:
        gateway = AsyncGateway(url, token)
        try:
            sandbox = cls(await gateway.session(session_id), token, gateway)
            await sandbox._ws.__aenter__()
            return sandbox
        except BaseException:
            await gateway.close()
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.delete()

    async def close(self) -> None:
        """Drop the connection and keep the session running."""
        await self._ws.__aexit__(None, None, None)
        await self._gateway.close()

    async def delete(self) -> None:
        """End the session (its sandbox is removed) and drop the connection."""
        await self._ws.__aexit__(None, None, None)
        try:
            await self._gateway.delete_session(self.id, missing_ok=True)
        finally:
            await self._gateway.close()

    @property
    def container(self) -> str:
        """The sandbox container's name (for ``docker exec`` and logs)."""
        return self.info.container

    @property
    def node(self) -> str:
        """The machine the sandbox runs on (a Swarm node's host name; "" on a single-host gateway)."""
        return self.info.node

    # -- egress ----------------------------------------------------------------------------------------

    async def set_allow(self, allow: Sequence[str], egress_mode: str | None = None) -> list[str]:
        """Replace the live allowlist (logged in the audit log); returns it in canonical form."""
        self.info = await self._gateway.update_session(self.id, allow, egress_mode)
        return list(self.info.allow)

    @property
    def secrets(self) -> dict[str, str]:
        """The session's secrets as the sandbox holds them: name -> placeholder (never a value)."""
        return dict(self.info.secrets)

    # -- lifetime --------------------------------------------------------------------------------------

    async def set_timeout(self, seconds: int) -> float:
        """The session now ends ``seconds`` from now (longer or shorter than before; at most the
        gateway's CORRAL_MAX_TIMEOUT_S): its new expiry, a Unix time (also in ``info.expires_at``)."""
        self.info = await self._gateway.set_timeout(self.id, seconds)
        return self.info.expires_at

    async def set_secret(
        self,
        name: str,
        value: str | None = None,
        *,
        allow: Sequence[str] | None = None,
        in_: Sequence[str] | None = None,
    ) -> str:
        """Add a secret (value and allow) or change one (what is given); needs the owner's API key.
        Returns its placeholder, which stays the same for the session's life."""
        self.info = await self._gateway.update_secrets(self.id, {name: secret_change(value, allow, in_)})
        return self.secrets[name]

    async def revoke_secret(self, name: str) -> None:
        """The proxy stops putting the secret in; its placeholder is refused from then on."""
        self.info = await self._gateway.update_secrets(self.id, {name: None})

    async def pause(self) -> SessionInfo:
        """Pause the session (see :meth:`Sandbox.pause`)."""
        await self._ws.__aexit__(None, None, None)
        self.info = await self._gateway.pause_session(self.id)
        return self.info

    async def resume(self, secrets: Mapping[str, str] | None = None) -> SessionInfo:
        """Resume a paused session (see :meth:`Sandbox.resume`)."""
        self.info = await self._gateway.resume_session(self.id, secrets)
        self._ws = AsyncSandboxClient(f"{self.info.ws_url}?token={self._token}")
        await self._ws.__aenter__()
        return self.info

    async def traffic(self, **filters: str) -> list[TrafficRecord]:
        """The session's audit records (filters: host, decision, event, action, since, until)."""
        return await self._gateway.traffic(self.id, **filters)

    async def save_profile(self) -> ProfileInfo:
        """Save the browser's cookies, local storage and IndexedDB now under the profile the session
        was created with (Chromium restarts for the copy: open pages are closed)."""
        return await self._gateway.save_profile(self.id)

    # -- port previews (docs/previews.md) -------------------------------------------------------------

    @property
    def previews(self) -> AsyncPreviews:
        """The session's port previews (see :attr:`Sandbox.previews`)."""
        return AsyncPreviews(self._gateway, self.id)

    @property
    def downloads(self) -> AsyncDownloads:
        """What the session's browser downloaded (see :attr:`Sandbox.downloads`)."""
        return AsyncDownloads(self._gateway, self.id)

    def get_host(self, port: int) -> str:
        """The host name a preview of ``port`` is served on (see :meth:`Sandbox.get_host`): no I/O."""
        return preview_host(self.id, port)
