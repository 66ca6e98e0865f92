"""Corral's egress addon for mitmproxy: the session's policy on every CONNECT and request, the vetted
address pinned for the upstream connection, and every event in the hash-chained audit log.

Order of checks: at CONNECT the target is decided before any DNS lookup or upstream dial; an
allowed name is resolved once, every address it resolves to is vetted, and the connection goes to
that address (pinned in ``server_connect``, so a second lookup can never rebind it). Each request
inside the tunnel must name the CONNECT target in its Host header and SNI (421 otherwise), then
passes the method and path rules. A refused CONNECT is still accepted and intercepted, without
ever reaching upstream, so the browser shows the 403 page that names the rule instead of a bare
tunnel error.

Every upstream answer let through is also kept (:mod:`corral.proxy.responses`) for hermetic
replays. In a hermetic session (``corral_hermetic``) nothing is resolved or dialled at all: after
the same policy checks, each request is answered from the recorded responses, or refused with a
"not in the recording" page; the sidecar then has no route out either.

Loaded by ``mitmdump -s`` in the sidecar (mitmproxy 12 on Python 3.13); also runs on mitmproxy 11.0
(Python 3.11), where the unit tests use it.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mitmproxy import connection, ctx, exceptions, http, tls
from mitmproxy import io as flow_io
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import server_hooks

from corral.proxy import control
from corral.proxy.audit import GENESIS, AuditLog, redact_headers, redact_url
from corral.proxy.hosts import normalize_host, own_addresses, parse_ip
from corral.proxy.policy import REPORTABLE_RULES, Decision, Policy, is_doh_request
from corral.proxy.responses import REPLAY_FILE, RESPONSES_FILE, Playback, ResponseStore

log = logging.getLogger(__name__)

NOTE = "corral"
POLICY_FILE = control.POLICY_FILE
AUDIT_FILE = control.AUDIT_FILE
RESOLVE_TIMEOUT_S = 5.0
MAX_ACTIONS = 64
REASONS = {403: "Forbidden", 421: "Misdirected Request", 502: "Bad Gateway"}
NOT_RECORDED = "not-recorded"


@dataclass(slots=True)
class Verdict:
    """What the proxy does about a decision: allow, deny, or report (allow, log the would-be deny)."""

    decision: Decision
    outcome: str
    status: int = 403  # what a refusal answers: 403 by policy, 421 misdirected, 502 unresolvable

    @property
    def refused(self) -> bool:
        return self.outcome == "deny"


@dataclass(slots=True)
class Tunnel:
    host: str
    port: int
    verdict: Verdict
    ip: str | None
    generation: int  # of the policy that decided it; a policy change re-decides the tunnel


@dataclass(slots=True)
class FlowNote:
    started: float
    action: str | None
    verdict: Verdict
    host: str  # the vetted name (mitmproxy's request.host may be the pinned address)
    logged: bool = False


Lookup = Callable[[str, int], Awaitable[list[str]]]


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses of ``host``, from the system resolver without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def parse_authority(value: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (IPv6 in brackets) to its canonical host and port; raises ValueError."""
    text = value.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"unclosed bracket in {value!r}")
        host, rest = text[: close + 1], text[close + 1 :]
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"junk after the address in {value!r}")
    else:
        host, _, port_text = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
        raise ValueError(f"bad port in {value!r}")
    return normalize_host(host), int(port_text) if port_text else default_port


def refusal_response(status: int, host: str, decision: Decision, accept: str) -> http.Response:
    """The page (or JSON body, for clients that ask for JSON) an agent sees when egress refuses."""
    unrecorded = decision.rule == NOT_RECORDED
    headers = {
        "Cache-Control": "no-store",
        "X-Corral-Egress": "not-recorded" if unrecorded else "denied",
        "X-Corral-Rule": decision.rule or "",
    }
    code = "not_recorded" if unrecorded else "egress_denied"
    if "application/json" in accept and "text/html" not in accept:
        body = json.dumps(
            {"error": {"code": code, "host": host, "rule": decision.rule, "reason": decision.reason}}
        ).encode()
        headers["Content-Type"] = "application/json"
    else:
        body = (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{'Not recorded' if unrecorded else 'Blocked by Corral'}: {html.escape(host)}</title></head><body>"
            f"<h1>{'Not in the recording' if unrecorded else 'Blocked by Corral&#39;s egress policy'}</h1>"
            f"<p id='reason'>{html.escape(decision.reason)}</p>"
            f"<p>Host: <code id='host'>{html.escape(host)}</code><br>"
            f"Rule: <code id='rule'>{html.escape(decision.rule or '')}</code></p>"
            + (
                "<p>This hermetic replay answers only what the recorded session fetched.</p>"
                if unrecorded
                else "<p>Ask the session's owner to add the host to the session's allowlist.</p>"
            )
            + "</body></html>"
        ).encode()
        headers["Content-Type"] = "text/html; charset=utf-8"
    return http.Response.make(status, body, headers)


class Egress:
    def __init__(self) -> None:
        self.policy = Policy([])
        self.mode = "enforce"
        self.audit: AuditLog | None = None
        self._state_dir: Path | None = None
        self._tunnels: dict[str, Tunnel] = {}  # client connection id -> its CONNECT
        self._pins: dict[tuple[str, str, int], str] = {}  # (client id, vetted address, port) -> its name
        self._resolved: dict[tuple[str, str, int], tuple[str | None, Verdict]] = {}  # plain HTTP lookups
        self._actions: dict[str, float] = {}  # agent actions in flight, in the order they started
        self._generation = 0  # bumped by each policy change
        self._control: asyncio.Server | None = None
        self.hermetic = False
        self.replay_error: str | None = "the recorded responses are not loaded"  # None once they are
        self.responses: ResponseStore | None = None  # upstream answers kept for hermetic replays
        self.playback = Playback()  # the recorded answers a hermetic session gives
        self.lookup: Lookup = system_lookup  # the one DNS seam (unit tests answer from a table)
        self._tokens: dict[str, str] = {}  # from corral_tokens_file, beside the options of the same name

    # -- options and lifecycle ------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        loader.add_option("corral_session", str, "", "The session this proxy serves (names the audit records).")
        loader.add_option("corral_state_dir", str, "", "Directory of the audit log and the persisted policy.")
        loader.add_option("corral_mode", str, "enforce", "enforce, or report (allow but log would-be denials).")
        loader.add_option("corral_control_host", str, "", "Address the control channel listens on; empty: none.")
        loader.add_option("corral_control_port", int, control.CONTROL_PORT, "Port of the control channel.")
        loader.add_option("corral_gateway_token", str, "", "Token of the gateway on the control channel.")
        loader.add_option("corral_controller_token", str, "", "Token of the sandbox's controller.")
        loader.add_option(
            "corral_tokens_file", str, "", 'JSON {"gateway": ..., "controller": ...}: the tokens, off the command line.'
        )
        loader.add_option("corral_trusted_networks", str, "", "Comma-separated networks exempt from the global deny.")
        loader.add_option("corral_allow_private", bool, False, "Operator override: lift the global deny.")
        loader.add_option("corral_own_hosts", str, "", "Comma-separated extra names of this proxy (refused).")
        loader.add_option("corral_keep_responses", bool, False, "Keep upstream answers for hermetic replays.")
        loader.add_option("corral_responses_max_body", int, 16 << 20, "Largest request+response kept, in bytes.")
        loader.add_option("corral_responses_max_total", int, 256 << 20, "Bytes of responses kept per session.")
        loader.add_option(
            "corral_hermetic", bool, False, f"Answer only from $corral_state_dir/{REPLAY_FILE}; never dial out."
        )

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("corral_") for name in updated):
            return
        opts = ctx.options
        # First: if anything below fails (mitmproxy only logs it), a hermetic proxy still never dials.
        self.hermetic = self.hermetic or opts.corral_hermetic
        if opts.corral_mode not in control.MODES:
            raise ValueError(f"corral_mode must be one of {', '.join(control.MODES)}")
        self.mode = opts.corral_mode
        allow: list[str] = []
        if opts.corral_state_dir:
            self._state_dir = Path(opts.corral_state_dir)
            saved = self._state_dir / POLICY_FILE
            if saved.exists():
                stored = json.loads(saved.read_text())
                allow, self.mode = list(stored.get("allow", [])), str(stored.get("mode", self.mode))
                # Continued across restarts: the gateway compares it with the generation it last set.
                self._generation = int(stored.get("generation", 0))
            if self.audit is None:
                self.audit = AuditLog(self._state_dir / AUDIT_FILE, opts.corral_session)
            if opts.corral_keep_responses and not opts.corral_hermetic and self.responses is None:
                self.responses = ResponseStore(
                    self._state_dir / RESPONSES_FILE, opts.corral_responses_max_body, opts.corral_responses_max_total
                )
        own = {socket.gethostname(), *own_addresses()}
        own.update(h.strip() for h in opts.corral_own_hosts.split(",") if h.strip())
        self.policy = Policy(
            allow,
            allow_private=opts.corral_allow_private,
            trusted_networks=[n.strip() for n in opts.corral_trusted_networks.split(",") if n.strip()],
            own_hosts=own,
        )
        if self.hermetic and self.replay_error is not None:
            self._load_replay()
        if "corral_tokens_file" in updated and opts.corral_tokens_file:
            # A file in the proxy's own tmpfs: a command line is readable by every user of the host.
            tokens = json.loads(Path(opts.corral_tokens_file).read_text())
            self._tokens = {"gateway": str(tokens.get("gateway", "")), "controller": str(tokens.get("controller", ""))}

    def _load_replay(self) -> None:
        """The recorded responses a hermetic session answers from; what went wrong is kept for the
        gateway's status check (every request is refused as not recorded)."""
        opts = ctx.options
        if opts.connection_strategy != "lazy":
            # Eager would dial the upstream at each CONNECT, which a hermetic session never does.
            self.replay_error = "corral_hermetic needs connection_strategy=lazy"
        elif self._state_dir is None:
            self.replay_error = "corral_hermetic needs corral_state_dir"
        else:
            try:
                flows = flow_io.read_flows_from_paths([str(self._state_dir / REPLAY_FILE)])
            except exceptions.FlowReadException as exc:
                self.replay_error = f"cannot read the recorded responses: {exc}"
            else:
                count = self.playback.add_recorded([f for f in flows if isinstance(f, http.HTTPFlow)])
                self.replay_error = None
                log.info("hermetic replay from %d recorded responses", count)
                return
        # A warning, not an error or an exception: mitmdump exits on either at startup, and the
        # gateway could not say why. The proxy stays up refusing everything as not recorded, and
        # its status carries the reason.
        log.warning("hermetic replay unavailable: %s", self.replay_error)

    async def running(self) -> None:
        opts = ctx.options
        if opts.corral_control_host and self._control is None:
            self._control = await asyncio.start_server(
                self._serve_control, opts.corral_control_host, opts.corral_control_port, limit=control.MAX_LINE_BYTES
            )
        self._log(
            "proxy",
            mode=self.mode,
            allow=self.policy.allow,
            version=_mitmproxy_version(),
            hermetic=self.hermetic or None,
            recorded_responses=self.playback.count() if self.hermetic else None,
        )

    async def done(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.responses is not None:
            self.responses.close()
            self.responses = None
        if self.audit is not None:
            self.audit.close()
            self.audit = None

    # -- decisions ------------------------------------------------------------------------------------

    def _verdict(self, decision: Decision, status: int = 403) -> Verdict:
        if decision.allowed:
            return Verdict(decision, "allow")
        if self.mode == "report" and status == 403 and decision.rule in REPORTABLE_RULES:
            return Verdict(decision, "report", status)  # the allowlist's refusal, let through and logged
        # The global deny (the proxy itself, private and metadata addresses, DoH), unparseable hosts
        # and paths: refused in every mode, before any lookup or dial.
        return Verdict(decision, "deny", status)

    async def _resolve(self, host: str, port: int) -> tuple[str | None, Verdict]:
        """One lookup; every address must pass, else a rebinding answer could smuggle one in."""
        if self.hermetic:
            # Nothing is dialled, so nothing is looked up: the name's own verdict stands.
            return None, Verdict(Decision(True, "hermetic replay: not resolved"), "allow")
        if parse_ip(host) is not None:
            return host, self._verdict(self.policy.resolved(host, host))
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                addresses = list(dict.fromkeys(await self.lookup(host, port)))
        except (OSError, TimeoutError) as exc:
            reason = f"cannot resolve {host}: {exc.strerror if isinstance(exc, OSError) else 'timed out'}"
            return None, Verdict(Decision(False, reason, "dns-error"), "deny", 502)
        chosen: str | None = None
        for address in addresses:
            verdict = self._verdict(self.policy.resolved(host, address))
            if not verdict.decision.allowed:
                return address if verdict.outcome == "report" else None, verdict
            chosen = chosen or address
        if chosen is None:
            return None, Verdict(Decision(False, f"{host} has no address", "dns-error"), "deny", 502)
        return chosen, Verdict(Decision(True, f"{host} resolves to {chosen}"), "allow")

    @staticmethod
    def _merge(verdict: Verdict, resolution: tuple[str | None, Verdict]) -> tuple[str | None, Verdict]:
        """The host's verdict combined with its address's: a refusal or a first denial wins."""
        ip, resolved = resolution
        if resolved.refused or (verdict.decision.allowed and not resolved.decision.allowed):
            return (None if resolved.refused else ip), resolved
        return ip, verdict

    def _action(self) -> str | None:
        return next(reversed(self._actions), None)

    # -- hooks ----------------------------------------------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        started, action = time.time(), self._action()
        raw_host, port = flow.request.host, flow.request.port
        verdict = self._verdict(self.policy.connect(raw_host, port))
        host, ip = _canonical_or_raw(raw_host), None
        if not verdict.refused:
            ip, verdict = self._merge(verdict, await self._resolve(host, port))
        self._tunnels[flow.client_conn.id] = Tunnel(host, port, verdict, ip, self._generation)
        flow.metadata[NOTE] = FlowNote(started, action, verdict, host)
        self._log(
            "connect",
            host=host,
            port=port,
            ip=ip,
            client=_peer(flow.client_conn),
            action=action,
            decision=verdict.outcome,
            rule=verdict.decision.rule,
            reason=verdict.decision.reason,
        )
        if verdict.refused:
            # Accept the tunnel without dialling upstream: each request in it then gets the refusal page.
            now = time.time()
            flow.response = http.Response(
                flow.request.data.http_version, 200, b"Connection established", http.Headers(), b"", None, now, now
            )

    async def _redecide(self, tunnel: Tunnel) -> None:
        """A kept-alive tunnel after a policy change: decided again, as a new CONNECT would be."""
        verdict = self._verdict(self.policy.connect(tunnel.host, tunnel.port))
        ip = tunnel.ip
        if not verdict.refused and ip is None:
            # Refused (or unresolvable) before: resolved and vetted now, as at a CONNECT.
            ip, verdict = self._merge(verdict, await self._resolve(tunnel.host, tunnel.port))
        tunnel.verdict, tunnel.ip, tunnel.generation = verdict, ip, self._generation

    def next_layer(self, data: Any) -> None:
        """Raw TCP would carry bytes past every request check: inside a tunnel, everything is HTTP."""
        from mitmproxy.proxy import layers

        if isinstance(data.layer, layers.TCPLayer) and data.context.client.id in self._tunnels:
            data.layer = layers.HttpLayer(data.context, layers.http.HTTPMode.transparent)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        # A WebSocket opened before a narrowing policy change does not outlive it.
        tunnel = self._tunnels.get(flow.client_conn.id)
        if tunnel is not None and tunnel.generation != self._generation:
            verdict = self._verdict(self.policy.connect(tunnel.host, tunnel.port))
            if verdict.refused:
                flow.kill()  # type: ignore[no-untyped-call,unused-ignore]

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        tunnel = self._tunnels.get(data.context.client.id)
        if self.hermetic or (tunnel is not None and tunnel.verdict.refused):
            data.establish_server_tls_first = False  # a refused (or hermetic) tunnel never meets its server

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        started, action = time.time(), self._action()
        tunnel = self._tunnels.get(flow.client_conn.id)
        if tunnel is not None and tunnel.generation != self._generation:
            await self._redecide(tunnel)
        request = flow.request
        verdict = self._misdirected(flow, tunnel)
        # Inside a tunnel mitmproxy names the request by the pinned address; the vetted name is the tunnel's.
        host = tunnel.host if tunnel is not None else _canonical_or_raw(request.host)
        if verdict is None and tunnel is not None and tunnel.verdict.refused:
            verdict = tunnel.verdict
        if verdict is None:
            verdict = self._verdict(self.policy.request(host, request.port, request.method, request.path))
            # DoH is refused in every mode: on a host the allowlist refused but report mode lets through too.
            if not verdict.refused and is_doh_request(request.path, _pairs(request.headers)):
                verdict = self._verdict(Decision(False, "DNS-over-HTTPS queries are refused", "doh"))
        if not verdict.refused and tunnel is None:
            # Plain HTTP through the proxy: resolve and vet here, then name the request by the vetted
            # address, so mitmproxy dials (and reuses) exactly that connection.
            key = (flow.client_conn.id, host, request.port)
            resolution = self._resolved.get(key)
            if resolution is None:
                # Once per client connection and host, like a tunnel: later requests reuse the vetted address.
                resolution = self._resolved[key] = await self._resolve(host, request.port)
            ip, verdict = self._merge(verdict, resolution)
            if ip is not None and not verdict.refused:
                self._pins[(flow.client_conn.id, ip, request.port)] = host
                request.data.host = ip
        flow.metadata[NOTE] = note = FlowNote(started, action, verdict, host)
        if verdict.refused:
            flow.response = refusal_response(verdict.status, host, verdict.decision, request.headers.get("accept", ""))
            note.logged = True
            self._log("block", **self._request_fields(flow, note))

    def _misdirected(self, flow: http.HTTPFlow, tunnel: Tunnel | None) -> Verdict | None:
        """421 when the request names another host than its tunnel (Host header or SNI) or its URL."""
        request = flow.request
        try:
            if tunnel is not None:
                if request.authority:
                    # Absolute-form inside a tunnel: servers act on its host, so it must be the tunnel's.
                    if parse_authority(request.authority, tunnel.port) != (tunnel.host, tunnel.port):
                        reason = f"the request names {request.authority} but the tunnel was opened to {tunnel.host}"
                        return Verdict(Decision(False, reason, "host-mismatch"), "deny", 421)
                    if request.http_version.startswith("HTTP/1"):
                        request.authority = ""  # sent on in origin form
                if not request.host_header:
                    return Verdict(Decision(False, "the request names no host", "host-mismatch"), "deny", 421)
                named = parse_authority(request.host_header, tunnel.port)
                if named != (tunnel.host, tunnel.port):
                    reason = f"the request is for {named[0]}:{named[1]} but the tunnel was opened to {tunnel.host}"
                    return Verdict(Decision(False, f"{reason}:{tunnel.port}", "host-mismatch"), "deny", 421)
                sni = flow.client_conn.sni
                if sni and normalize_host(sni) != tunnel.host:
                    reason = f"TLS SNI {sni} does not match the tunnel's host {tunnel.host}"
                    return Verdict(Decision(False, reason, "sni-mismatch"), "deny", 421)
            elif request.host_header:
                host = normalize_host(request.host)
                named = parse_authority(request.host_header, request.port)
                if named != (host, request.port):
                    reason = f"the Host header names {named[0]}:{named[1]} but the URL {host}:{request.port}"
                    return Verdict(Decision(False, reason, "host-mismatch"), "deny", 421)
        except ValueError as exc:
            return Verdict(Decision(False, str(exc), "invalid-host"), "deny", 421)
        return None

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        if data.server.address is None:
            return
        if self.hermetic:
            data.server.error = "a hermetic replay never connects upstream"
            self._log(
                "error",
                host=str(data.server.address[0]),
                port=data.server.address[1],
                error=data.server.error,
                action=self._action(),
            )
            return
        raw_host, port = data.server.address
        tunnel = self._tunnels.get(data.client.id)
        ip: str | None
        name: str | None
        if tunnel is not None and port == tunnel.port and _canonical_or_raw(raw_host) in (tunnel.host, tunnel.ip):
            if tunnel.verdict.refused:
                data.server.error = f"refused by the egress policy: {tunnel.verdict.decision.reason}"
                return
            ip, name = tunnel.ip, tunnel.host
        else:
            name = self._pins.get((data.client.id, raw_host, port))
            ip = raw_host if name is not None else None
            if ip is None:
                # A connection no hook vetted (should not happen): vet it here rather than dial blind.
                host = _canonical_or_raw(raw_host)
                verdict = self._verdict(self.policy.connect(raw_host, port))
                if not verdict.refused:
                    ip, verdict = self._merge(verdict, await self._resolve(host, port))
                if verdict.refused or ip is None:
                    data.server.error = f"refused by the egress policy: {verdict.decision.reason}"
                    self._log("error", host=host, port=port, error=data.server.error, action=self._action())
                    return
                name = host
        if ip is None:
            data.server.error = "no vetted address"
            return
        # Dial the vetted address (no second lookup can rebind it); present the vetted name as SNI.
        data.server.address = (ip, port)
        if data.server.sni is None and name is not None and parse_ip(name) is None:
            data.server.sni = name

    def client_disconnected(self, client: connection.Client) -> None:
        self._tunnels.pop(client.id, None)
        for key in [key for key in self._pins if key[0] == client.id]:
            del self._pins[key]
        for resolved in [key for key in self._resolved if key[0] == client.id]:
            del self._resolved[resolved]

    def request(self, flow: http.HTTPFlow) -> None:
        """In a hermetic session, every request the policy let through is answered from the recording."""
        note = flow.metadata.get(NOTE)
        if not self.hermetic or not isinstance(note, FlowNote) or flow.response is not None:
            return
        recorded = self.playback.next_flow(flow)
        # A recorded WebSocket upgrade cannot be replayed: there is no server to carry it on.
        if recorded is not None and recorded.response is not None and recorded.response.status_code != 101:
            response = recorded.response.copy()
            if ctx.options.server_replay_refresh:
                response.refresh()  # type: ignore[no-untyped-call,unused-ignore]
            flow.response = response
            flow.is_replay = "response"
            return
        reason = f"{flow.request.method} {redact_url(_url(flow.request, note.host))} is not in the recording"
        note.verdict = Verdict(Decision(False, reason, NOT_RECORDED), "deny", 502)
        flow.response = refusal_response(502, note.host, note.verdict.decision, flow.request.headers.get("accept", ""))
        note.logged = True
        self._log("block", **self._request_fields(flow, note))

    def response(self, flow: http.HTTPFlow) -> None:
        note = flow.metadata.get(NOTE)
        if not isinstance(note, FlowNote) or note.logged or flow.request.method == "CONNECT":
            return
        note.logged = True
        self._log("request", **self._request_fields(flow, note))
        if self.responses is not None and not note.verdict.refused and not flow.is_replay:
            self.responses.offer(flow, note.host)

    def error(self, flow: http.HTTPFlow) -> None:
        note = flow.metadata.get(NOTE)
        if not isinstance(note, FlowNote) or note.logged:
            return
        note.logged = True
        request = flow.request
        self._log(
            "error",
            id=flow.id,
            method=request.method,
            url=redact_url(_url(request, note.host)) if request.method != "CONNECT" else None,
            host=note.host,
            port=request.port,
            ip=_peer(flow.server_conn),
            error=flow.error.msg if flow.error else "unknown error",
            action=note.action,
            decision=note.verdict.outcome,
            duration_ms=round((time.time() - note.started) * 1000, 3),
        )

    # -- records --------------------------------------------------------------------------------------

    def _log(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.write(event, **fields)

    def _request_fields(self, flow: http.HTTPFlow, note: FlowNote) -> dict[str, Any]:
        request, response = flow.request, flow.response
        ended = response.timestamp_end if response is not None and response.timestamp_end else time.time()
        verdict = note.verdict
        return {
            "id": flow.id,
            "started": note.started,
            "method": request.method,
            "url": redact_url(_url(request, note.host)),
            "scheme": request.scheme,
            "host": note.host,
            "port": request.port,
            "ip": None if verdict.refused or flow.is_replay else _peer(flow.server_conn),
            "sni": flow.client_conn.sni,
            "http_version": request.http_version,
            "status": response.status_code if response is not None else 0,
            "request_headers": redact_headers(_pairs(request.headers)),
            "response_headers": redact_headers(_pairs(response.headers)) if response is not None else [],
            "mime": response.headers.get("content-type") if response is not None else None,
            "bytes_out": len(request.raw_content or b""),
            "bytes_in": len(response.raw_content or b"") if response is not None else 0,
            "duration_ms": round(max(0.0, ended - note.started) * 1000, 3),
            "decision": verdict.outcome,
            "rule": verdict.decision.rule,
            "reason": verdict.decision.reason,
            "action": note.action,
            **({"replayed": True} if flow.is_replay == "response" else {}),
        }

    # -- control channel ------------------------------------------------------------------------------

    def _role(self, token: str) -> control.Role | None:
        opts = ctx.options
        gateway = self._tokens.get("gateway") or opts.corral_gateway_token
        controller = self._tokens.get("controller") or opts.corral_controller_token
        if gateway and hmac.compare_digest(token, gateway):
            return "gateway"
        if controller and hmac.compare_digest(token, controller):
            return "controller"
        return None

    async def _serve_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened: set[str] = set()  # actions this connection started: dropped with it (a dead controller)
        try:
            role: control.Role | None = None
            while line := await reader.readline():
                try:
                    message = control.parse_message(line)
                    if role is None:
                        if not isinstance(message, control.Hello) or (role := self._role(message.token)) is None:
                            writer.write(control.encode({"ok": False, "error": "unknown token"}))
                            break
                        writer.write(control.encode({"ok": True, "role": role}))
                        await writer.drain()
                        continue
                    if isinstance(message, control.ActionEvent):
                        (opened.add if message.phase == "start" else opened.discard)(message.id)
                    reply = self.handle_control(role, message)
                except control.InvalidMessage as exc:
                    reply = exc.reply()
                except (ValueError, OSError) as exc:
                    reply = {"ok": False, "code": control.INVALID_REQUEST, "error": str(exc)}
                if reply is not None:
                    writer.write(control.encode(reply))
                    await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            for action in opened:
                self._actions.pop(action, None)
            writer.close()

    def handle_control(self, role: control.Role, message: control.Message) -> dict[str, Any] | None:
        """One control message from an authenticated peer; the reply, or None when none is due."""
        if isinstance(message, control.ActionEvent):
            if role != "controller":
                raise ValueError("only the controller reports actions")
            if message.phase == "start":
                if len(self._actions) >= MAX_ACTIONS:
                    self._actions.pop(next(iter(self._actions)))  # the oldest: a start whose end was lost
                self._actions[message.id] = time.time()
            else:
                self._actions.pop(message.id, None)
            return {"ok": True} if message.ack else None
        if role != "gateway":
            raise ValueError("only the gateway may do that")
        if isinstance(message, control.SetPolicy):
            policy = self.policy.with_allow(message.allow)
            previous_allow, previous_mode = self.policy.allow, self.mode
            generation = self._generation + 1
            # Persisted and logged before it takes effect: no policy is ever live without its record.
            self._persist(policy.allow, message.mode, generation)
            self._log(
                "policy",
                allow=policy.allow,
                mode=message.mode,
                previous_allow=previous_allow,
                previous_mode=previous_mode,
                actor=message.actor,
                generation=generation,
            )
            self.policy, self.mode, self._generation = policy, message.mode, generation
            return {"ok": True, **self._policy_state()}
        if isinstance(message, control.Status):
            return {
                "ok": True,
                "session": ctx.options.corral_session,
                **self._policy_state(),
                "records": self.audit.seq if self.audit is not None else 0,
                "actions": list(self._actions),
                "hermetic": self.hermetic,
                "replay": {"flows": self.playback.count(), "error": self.replay_error} if self.hermetic else None,
                "responses": self.responses.counts() if self.responses is not None else None,
            }
        raise ValueError("unexpected message")

    def _policy_state(self) -> dict[str, Any]:
        """What the gateway checks on each answer: the live policy, its generation, the chain's head."""
        head = self.audit.head if self.audit is not None else {"seq": 0, "hash": GENESIS}
        return {"allow": self.policy.allow, "mode": self.mode, "generation": self._generation, "head": head}

    def _persist(self, allow: list[str], mode: str, generation: int) -> None:
        if self._state_dir is None:
            return
        target = self._state_dir / POLICY_FILE
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps({"allow": allow, "mode": mode, "generation": generation}))
        os.replace(temporary, target)


def _url(request: http.Request, host: str) -> str:
    """The URL as the client asked for it: by name, not by the address it was pinned to."""
    default = {"http": 80, "https": 443}.get(request.scheme)
    authority = f"[{host}]" if ":" in host else host
    if request.port != default:
        authority += f":{request.port}"
    return f"{request.scheme}://{authority}{request.path}"


def _pairs(headers: http.Headers) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.fields]


def _canonical_or_raw(host: str) -> str:
    try:
        return normalize_host(host)
    except ValueError:
        return host


def _peer(conn: connection.Connection) -> str | None:
    return str(conn.peername[0]) if conn.peername else None


def _mitmproxy_version() -> str:
    from mitmproxy import version

    return str(version.VERSION)


addons = [Egress()]
