"""The egress addons as mitmdump runs them, on mitmproxy's own test doubles (taddons, tflow).

:class:`Proxy` drives load.py's composition: each hook, by mitmproxy's name for it, is invoked on
every addon that has it, in load.py's order, through mitmproxy's own addon manager. DNS answers
come from a table (:data:`DNS`); every audit record read back is checked against the record type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mitmproxy import hooks, http, io
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.serverplayback import ServerPlayback
from mitmproxy.proxy import layer, server_hooks  # noqa: F401  (layer: registers the hook names it defines)
from mitmproxy.proxy.layers import http as http_layer  # noqa: F401
from mitmproxy.test import taddons, tflow, tutils

from corral.proxy.addons import ControlChannel, Shared
from corral.proxy.audit import CHAIN_FIELDS, EVENT_FIELDS, AuditRecord
from corral.proxy.load import compose
from corral.proxy.responses import REPLAY_FILE, RESPONSES_FILE

DNS = {
    "allowed.test": ["203.0.113.10"],
    "api.allowed.test": ["203.0.113.11"],
    "other.test": ["203.0.113.12"],
    "rebind.test": ["203.0.113.13", "10.0.0.5"],
    "private.test": ["192.168.1.20"],
    "meta.test": ["169.254.169.254"],
}

OPTIONS = {
    "corral_session": "ses_test",
    # 203.0.113.0/24 is documentation space, globally denied unless the operator trusts it.
    "corral_trusted_networks": "203.0.113.0/24",
    "corral_own_hosts": "corral-proxy",
}


class Lookups:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in DNS:
            raise OSError(-2, "Name or service not known")
        return DNS[host]


class Proxy:
    """load.py's addons in a taddons context."""

    def __init__(self, tctx: taddons.context, shared: Shared, addons: list[object]) -> None:
        self.tctx, self.shared, self.addons = tctx, shared, addons
        (self.channel,) = (addon for addon in addons if isinstance(addon, ControlChannel))

    async def hook(self, name: str, *args: Any) -> None:
        event = hooks.all_hooks[name](*args)
        for addon in self.addons:
            await self.tctx.master.addons.invoke_addon(addon, event)

    def configure(self, updated: set[str]) -> None:
        for addon in self.addons:
            self.tctx.master.addons.invoke_addon_sync(addon, hooks.ConfigureHook(updated))

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        await self.hook("http_connect", flow)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        await self.hook("requestheaders", flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        await self.hook("request", flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        await self.hook("response", flow)

    async def error(self, flow: http.HTTPFlow) -> None:
        await self.hook("error", flow)

    async def server_connect(self, flow: http.HTTPFlow, server: Any = None) -> Any:
        """The server_connect hook for ``server`` (the flow's own by default) of the flow's client."""
        server = flow.server_conn if server is None else server
        await self.hook("server_connect", server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn))
        return server

    async def running(self) -> None:
        await self.hook("running")

    async def done(self) -> None:
        await self.hook("done")

    def control(self, role: str, message: Any) -> dict[str, Any] | None:
        """The channel's answer as it goes on the wire (None when none is due)."""
        reply = self.channel.handle(role, message)  # type: ignore[arg-type]
        return reply.to_json() if reply is not None else None


class LoadedScript:
    """What mitmdump's script loader registers for ``-s load.py``: one addon whose children are
    load.py's list, so every option is declared before any addon is configured."""

    def __init__(self, addons: list[object]) -> None:
        self.addons = addons


@contextmanager
def session_proxy(*before: object, lookups: Lookups | None = None, **options: Any) -> Iterator[Proxy]:
    """load.py's addons (after ``before``, e.g. mitmdump's own), configured with ``options``."""
    shared = Shared()
    shared.policy.lookup = lookups or Lookups()
    addons = compose(shared)
    with taddons.context(*before, LoadedScript(addons)) as tctx:
        if options:
            tctx.configure(addons[0], **options)
        yield Proxy(tctx, shared, addons)


def records(path: Path) -> list[AuditRecord]:
    """The audit records in ``path`` (a state dir), each checked against the record type."""
    found: list[AuditRecord] = [json.loads(line) for line in (path / "audit.jsonl").read_text().splitlines() if line]
    for record in found:
        assert set(record) <= CHAIN_FIELDS | EVENT_FIELDS[record["event"]], record
    return found


def connect_flow(host: str, port: int = 443) -> http.HTTPFlow:
    return tflow.tflow(req=tutils.treq(method=b"CONNECT", host=host, port=port, path=b"", headers=http.Headers()))


def tunnel_request(connect: http.HTTPFlow, host_header: str, path: str = "/", method: str = "GET") -> http.HTTPFlow:
    if host_header.startswith("["):
        host, _, port = host_header[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = host_header.partition(":")
    req = tutils.treq(
        method=method.encode(),
        scheme=b"https",
        host=host,
        port=int(port or 443),
        path=path.encode(),
        headers=http.Headers(host=host_header, authorization="Bearer s3cret"),
        content=b"",
    )
    connect.client_conn.sni = connect.request.host  # a browser sends the tunnel's host as SNI
    return tflow.tflow(client_conn=connect.client_conn, req=req)


def plain_request(url_host: str, port: int = 80, host_header: str | None = None, path: str = "/") -> http.HTTPFlow:
    req = tutils.treq(
        host=url_host,
        port=port,
        path=path.encode(),
        headers=http.Headers(host=host_header or url_host),
        content=b"",
    )
    return tflow.tflow(req=req)


def write_policy(state: Path, allow: list[str], **fields: Any) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "policy.json").write_text(json.dumps({"allow": allow, **fields}))


def answered(flow: http.HTTPFlow, body: bytes, status: int = 200, **headers: str) -> http.HTTPFlow:
    flow.response = tutils.tresp(status_code=status, content=body, headers=http.Headers(**headers))
    return flow


async def record_visit(proxy: Proxy, path: str, body: bytes) -> http.HTTPFlow:
    connect = connect_flow("api.allowed.test")
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, "api.allowed.test", path)
    flow.request.headers["cookie"] = "session=abc"
    flow.request.headers["x-goog-api-key"] = "AIza-secret"
    await proxy.requestheaders(flow)
    flow.request.data.host = "203.0.113.11"  # mitmproxy names a tunnel's request by the pinned address
    await proxy.response(answered(flow, body, **{"content-type": "text/html", "set-cookie": "id=1"}))
    return flow


def read_flows(path: Path) -> list[http.HTTPFlow]:
    with path.open("rb") as stream:
        return [f for f in io.FlowReader(stream).stream() if isinstance(f, http.HTTPFlow)]


async def replay_visit(proxy: Proxy, path: str, host: str = "api.allowed.test") -> http.HTTPFlow:
    connect = connect_flow(host)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, host, path)
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    await proxy.response(flow)
    return flow


@contextmanager
def hermetic_from(recorded: Path, tmp_path: Path, **options: Any) -> Iterator[Proxy]:
    """A second session answering from what a first one recorded (in ``recorded``); its state dir
    is ``tmp_path / "replay"``."""
    state = tmp_path / "replay"
    write_policy(state, ["allowed.test", "*.allowed.test"], mode="enforce")
    source = recorded / RESPONSES_FILE
    (state / REPLAY_FILE).write_bytes(source.read_bytes() if source.exists() else b"")
    # mitmdump's own addons declare the server_replay_* options and connection_strategy.
    settings = {"connection_strategy": "lazy", **OPTIONS, **options}
    with session_proxy(
        Proxyserver(), ServerPlayback(), corral_state_dir=str(state), corral_hermetic=True, **settings
    ) as hermetic:
        yield hermetic
