"""Policy decisions: every CONNECT and every request judged before anything is dialled.

At CONNECT the target is decided by name before any DNS lookup; an allowed name is resolved once
and every address it resolves to vetted (:class:`~corral.proxy.vetting.LivePolicy`). Each request
inside the tunnel must name the CONNECT target in its Host header and SNI (421 otherwise), then
passes the method and path rules. A refused CONNECT is still accepted and intercepted, without
ever reaching upstream, so the browser shows the 403 page that names the rule instead of a bare
tunnel error. The decision travels with the flow (:class:`~corral.proxy.addons.state.FlowNote`)
for the addons after this one: pinning, playback, audit records.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from corral.proxy.addons.flows import header_pairs
from corral.proxy.addons.state import NOTE, FlowNote, Shared, Tunnel, attribution_of
from corral.proxy.control import MODES, POLICY_FILE
from corral.proxy.hosts import canonical_or_raw, normalize_host, own_addresses, parse_authority
from corral.proxy.policy import Decision, Policy, is_doh_request
from corral.proxy.refusal import refusal_response
from corral.proxy.vetting import Verdict, merge


class PolicyGate:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.live = shared.policy
        self.connections = shared.connections

    def load(self, loader: Loader) -> None:
        loader.add_option("corral_mode", str, "enforce", "enforce, or report (allow but log would-be denials).")
        loader.add_option("corral_trusted_networks", str, "", "Comma-separated networks exempt from the global deny.")
        loader.add_option("corral_allow_private", bool, False, "Operator override: lift the global deny.")
        loader.add_option("corral_own_hosts", str, "", "Comma-separated extra names of this proxy (refused).")
        loader.add_option(
            "corral_host_addresses",
            str,
            "",
            "Comma-separated addresses of the gateway's host (refused, trusted or not).",
        )

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("corral_") for name in updated):
            return
        opts = ctx.options
        if opts.corral_mode not in MODES:
            raise _bad_option(f"corral_mode must be one of {', '.join(MODES)}")
        self.live.mode = opts.corral_mode
        allow: list[str] = []
        if opts.corral_state_dir:
            try:
                allow = self.live.restore(Path(opts.corral_state_dir) / POLICY_FILE)
            except (OSError, ValueError) as exc:
                raise _bad_option(f"cannot read the persisted policy: {exc}") from None
        own = {socket.gethostname(), *own_addresses(), *_items(opts.corral_own_hosts)}
        try:
            self.live.policy = Policy(
                allow,
                allow_private=opts.corral_allow_private,
                trusted_networks=_items(opts.corral_trusted_networks),
                own_hosts=own,
                host_addresses=_items(opts.corral_host_addresses),
            )
        except ValueError as exc:
            raise _bad_option(f"bad egress policy: {exc}") from None

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        started, attribution = time.time(), attribution_of(flow, self.shared)
        host, port = canonical_or_raw(flow.request.host), flow.request.port
        ip, verdict = await self.live.vet(host, port)
        self.connections.tunnels[flow.client_conn.id] = Tunnel(host, port, verdict, ip, self.live.generation)
        flow.metadata[NOTE] = FlowNote(started, attribution, verdict, host, ip)
        if verdict.refused:
            # Accept the tunnel without dialling upstream: each request in it then gets the refusal page.
            now = time.time()
            flow.response = http.Response(
                flow.request.data.http_version, 200, b"Connection established", http.Headers(), b"", None, now, now
            )

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        started, attribution = time.time(), attribution_of(flow, self.shared)
        tunnel = self.connections.tunnels.get(flow.client_conn.id)
        if tunnel is not None and tunnel.generation != self.live.generation:
            await self._redecide(tunnel)
        # Inside a tunnel mitmproxy names the request by the pinned address; the vetted name is the tunnel's.
        host = tunnel.host if tunnel is not None else canonical_or_raw(flow.request.host)
        verdict = self._judge(flow, tunnel, host)
        ip = None
        if not verdict.refused and tunnel is None:
            ip, verdict = await self._vet_plain(flow, host, verdict)
        flow.metadata[NOTE] = FlowNote(started, attribution, verdict, host, ip)
        if verdict.refused:
            accept = flow.request.headers.get("accept", "")
            flow.response = refusal_response(verdict.status, host, verdict.decision, accept)

    def next_layer(self, data: Any) -> None:
        """Raw TCP would carry bytes past every request check: inside a tunnel, everything is HTTP."""
        from mitmproxy.proxy import layers

        if isinstance(data.layer, layers.TCPLayer) and data.context.client.id in self.connections.tunnels:
            data.layer = layers.HttpLayer(data.context, layers.http.HTTPMode.transparent)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        # A WebSocket opened before a narrowing policy change does not outlive it.
        tunnel = self.connections.tunnels.get(flow.client_conn.id)
        if tunnel is None or tunnel.generation == self.live.generation:
            return
        if self.live.verdict(self.live.policy.connect(tunnel.host, tunnel.port)).refused:
            flow.kill()  # type: ignore[no-untyped-call,unused-ignore]

    async def _redecide(self, tunnel: Tunnel) -> None:
        """A kept-alive tunnel after a policy change: decided again, as a new CONNECT would be."""
        verdict = self.live.verdict(self.live.policy.connect(tunnel.host, tunnel.port))
        ip = tunnel.ip
        if not verdict.refused and ip is None:
            # Refused (or unresolvable) before: resolved and vetted now, as at a CONNECT.
            ip, verdict = merge(verdict, await self.live.resolve(tunnel.host, tunnel.port))
        tunnel.verdict, tunnel.ip, tunnel.generation = verdict, ip, self.live.generation

    def _judge(self, flow: http.HTTPFlow, tunnel: Tunnel | None, host: str) -> Verdict:
        """The request by its host and the policy's rules (its address is vetted apart)."""
        verdict = _misdirected(flow, tunnel)
        if verdict is not None:
            return verdict
        if tunnel is not None and tunnel.verdict.refused:
            return tunnel.verdict
        request = flow.request
        verdict = self.live.verdict(self.live.policy.request(host, request.port, request.method, request.path))
        # DoH is refused in every mode: on a host the allowlist refused but report mode lets through too.
        if not verdict.refused and is_doh_request(request.path, header_pairs(request.headers)):
            verdict = self.live.verdict(Decision(False, "DNS-over-HTTPS queries are refused", "doh"))
        return verdict

    async def _vet_plain(self, flow: http.HTTPFlow, host: str, verdict: Verdict) -> tuple[str | None, Verdict]:
        """Plain HTTP through the proxy: the address is resolved and vetted here, once per client
        connection and host, like a tunnel's (later requests reuse the vetted address)."""
        key = (flow.client_conn.id, host, flow.request.port)
        resolution = self.connections.resolved.get(key)
        if resolution is None:
            resolution = self.connections.resolved[key] = await self.live.resolve(host, flow.request.port)
        return merge(verdict, resolution)


def _misdirected(flow: http.HTTPFlow, tunnel: Tunnel | None) -> Verdict | None:
    """421 when the request names another host than its tunnel (Host header or SNI) or its URL."""
    try:
        if tunnel is not None:
            return _misdirected_in_tunnel(flow, tunnel)
        request = flow.request
        if request.host_header:
            host = normalize_host(request.host)
            named = parse_authority(request.host_header, request.port)
            if named != (host, request.port):
                reason = f"the Host header names {named[0]}:{named[1]} but the URL {host}:{request.port}"
                return _misdirect(reason, "host-mismatch")
    except ValueError as exc:
        return _misdirect(str(exc), "invalid-host")
    return None


def _misdirected_in_tunnel(flow: http.HTTPFlow, tunnel: Tunnel) -> Verdict | None:
    request = flow.request
    if request.authority:
        # Absolute-form inside a tunnel: servers act on its host, so it must be the tunnel's.
        if parse_authority(request.authority, tunnel.port) != (tunnel.host, tunnel.port):
            reason = f"the request names {request.authority} but the tunnel was opened to {tunnel.host}"
            return _misdirect(reason, "host-mismatch")
        if request.http_version.startswith("HTTP/1"):
            request.authority = ""  # sent on in origin form
    if not request.host_header:
        return _misdirect("the request names no host", "host-mismatch")
    named = parse_authority(request.host_header, tunnel.port)
    if named != (tunnel.host, tunnel.port):
        reason = f"the request is for {named[0]}:{named[1]} but the tunnel was opened to {tunnel.host}"
        return _misdirect(f"{reason}:{tunnel.port}", "host-mismatch")
    sni = flow.client_conn.sni
    if sni and normalize_host(sni) != tunnel.host:
        return _misdirect(f"TLS SNI {sni} does not match the tunnel's host {tunnel.host}", "sni-mismatch")
    return None


def _misdirect(reason: str, rule: str) -> Verdict:
    return Verdict(Decision(False, reason, rule), "deny", 421)


def _bad_option(message: str) -> exceptions.OptionsError:
    # What mitmproxy expects of configure: it rolls the update back (and mitmdump exits at startup).
    return exceptions.OptionsError(message)  # type: ignore[no-untyped-call,unused-ignore]


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
