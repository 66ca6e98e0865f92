"""Pinning: every upstream connection goes to the address the policy vetted, never to a second lookup.

The name a CONNECT or a plain-HTTP request named was resolved once and each of its addresses
vetted (:mod:`corral.proxy.addons.gate`); here the connection is dialled to that address, with the
vetted name as SNI, so a rebinding answer can never redirect it. A connection no hook vetted is
vetted here rather than dialled blind; a refused tunnel, or a hermetic session, dials nothing.
"""

from __future__ import annotations

from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from corral.proxy.addons.state import Shared, note_of
from corral.proxy.audit import EventFields
from corral.proxy.hosts import canonical_or_raw, parse_ip


class Pinning:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.live = shared.policy
        self.connections = shared.connections
        self.journal = shared.journal

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Plain HTTP: the request is named by its vetted address, so mitmproxy dials (and reuses)
        exactly that connection; the pin remembers the name it stands for."""
        note = note_of(flow)
        if note is None or note.ip is None or note.verdict.refused:
            return
        self.connections.pins[(flow.client_conn.id, note.ip, flow.request.port)] = note.host
        flow.request.data.host = note.ip

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        tunnel = self.connections.tunnels.get(data.context.client.id)
        if self.live.hermetic or (tunnel is not None and tunnel.verdict.refused):
            data.establish_server_tls_first = False  # a refused (or hermetic) tunnel never meets its server

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.address is None:
            return
        if self.live.hermetic:
            server.error = "a hermetic replay never connects upstream"
            self._refused(data.client, str(server.address[0]), server.address[1], server.error)
            return
        target = await self._vetted(data.client, *server.address)
        if isinstance(target, str):
            server.error = target
            return
        ip, name = target
        # Dial the vetted address (no second lookup can rebind it); present the vetted name as SNI.
        server.address = (ip, server.address[1])
        if server.sni is None and parse_ip(name) is None:
            server.sni = name

    def client_disconnected(self, client: connection.Client) -> None:
        self.connections.forget(client.id)

    async def _vetted(self, client: connection.Client, raw_host: str, port: int) -> tuple[str, str] | str:
        """The vetted address and name to dial for this connection, or why there is none."""
        tunnel = self.connections.tunnels.get(client.id)
        if tunnel is not None and port == tunnel.port and canonical_or_raw(raw_host) in (tunnel.host, tunnel.ip):
            if tunnel.verdict.refused:
                return f"refused by the egress policy: {tunnel.verdict.decision.reason}"
            return (tunnel.ip, tunnel.host) if tunnel.ip is not None else "no vetted address"
        name = self.connections.pins.get((client.id, raw_host, port))
        if name is not None:
            return raw_host, name
        # A connection no hook vetted (should not happen): vet it here rather than dial blind.
        host = canonical_or_raw(raw_host)
        ip, verdict = await self.live.vet(host, port)
        if verdict.refused or ip is None:
            error = f"refused by the egress policy: {verdict.decision.reason}"
            self._refused(client, host, port, error)
            return error
        return ip, host

    def _refused(self, client: connection.Client, host: str, port: int, error: str) -> None:
        fields: EventFields = {"host": host, "port": port, "error": error}
        fields.update(self.shared.charged_to(client.id).record())
        self.journal.write("error", **fields)
