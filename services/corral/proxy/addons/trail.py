"""Audit records: one hash-chained record (:class:`~corral.proxy.audit.AuditRecord`) for every
CONNECT, request, refusal and failure, written before the answer leaves the proxy.

This addon runs after the ones that decide and answer (load.py's order): it reads what they
decided from the flow's note and writes it once (a refused request at the hook that refused it, the
rest at ``response`` or ``error``). The proxy's start is its first record; policy changes and
connections refused before any request are written by the addons that make them.
"""

from __future__ import annotations

import time
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from corral.proxy.addons.flows import header_pairs, peer, url_of
from corral.proxy.addons.state import FlowNote, Shared, note_of
from corral.proxy.audit import DEFAULT_MAX_BYTES, AuditLog, EventFields, redact_headers, redact_url
from corral.proxy.control import AUDIT_FILE


class AuditTrail:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.journal = shared.journal

    def load(self, loader: Loader) -> None:
        loader.add_option("corral_session", str, "", "The session this proxy serves (names the audit records).")
        loader.add_option("corral_state_dir", str, "", "Directory of the audit log and the persisted policy.")
        loader.add_option(
            "corral_audit_max_bytes",
            int,
            DEFAULT_MAX_BYTES,
            "Bytes of audit records per session; past them, traffic is counted (tally records), not written.",
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if any(name.startswith("corral_") for name in updated) and opts.corral_state_dir and self.journal.log is None:
            self.journal.log = AuditLog(
                Path(opts.corral_state_dir) / AUDIT_FILE,
                opts.corral_session,
                max_bytes=max(1, opts.corral_audit_max_bytes),
            )

    def running(self) -> None:
        live, hermetic = self.shared.policy, self.shared.policy.hermetic
        self.journal.write(
            "proxy",
            mode=live.mode,
            allow=live.policy.allow,
            version=_mitmproxy_version(),
            hermetic=hermetic or None,
            recorded_responses=self.shared.replay.flows if hermetic else None,
        )

    def done(self) -> None:
        if self.journal.log is not None:
            self.journal.log.close()
            self.journal.log = None

    def http_connect(self, flow: http.HTTPFlow) -> None:
        note = note_of(flow)
        if note is None:
            return
        verdict = note.verdict
        fields: EventFields = {
            "host": note.host,
            "port": flow.request.port,
            "ip": note.ip,
            "client": peer(flow.client_conn),
            "decision": verdict.outcome,
            "rule": verdict.decision.rule,
            "reason": verdict.decision.reason,
        }
        fields.update(note.attribution.record())
        self.journal.write("connect", **fields)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._refused(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        self._refused(flow)  # a hermetic session's "not in the recording"

    def response(self, flow: http.HTTPFlow) -> None:
        note = note_of(flow)
        if note is None or note.logged or flow.request.method == "CONNECT":
            return
        note.logged = True
        # Refused at its answer (one that still holds a brokered secret's value it cannot scrub): a block.
        self.journal.write("block" if note.verdict.refused else "request", **exchange(flow, note))

    def error(self, flow: http.HTTPFlow) -> None:
        note = note_of(flow)
        if note is None or note.logged:
            return
        note.logged = True
        request = flow.request
        fields: EventFields = {
            "id": flow.id,
            "method": request.method,
            "url": redact_url(url_of(request, note.host)) if request.method != "CONNECT" else None,
            "host": note.host,
            "port": request.port,
            "ip": peer(flow.server_conn),
            "error": flow.error.msg if flow.error else "unknown error",
            "decision": note.verdict.outcome,
            "duration_ms": round((time.time() - note.started) * 1000, 3),
        }
        fields.update(note.attribution.record())
        self.journal.write("error", **fields)

    def _refused(self, flow: http.HTTPFlow) -> None:
        """A request the proxy answered itself with a refusal: its record, at the hook that refused it."""
        note = note_of(flow)
        if note is None or note.logged or not note.verdict.refused or flow.response is None:
            return
        note.logged = True
        self.journal.write("block", **exchange(flow, note))


def exchange(flow: http.HTTPFlow, note: FlowNote) -> EventFields:
    """The fields of a request record (or a block's): the request, its answer and the decision."""
    request, response = flow.request, flow.response
    ended = response.timestamp_end if response is not None and response.timestamp_end else time.time()
    verdict = note.verdict
    fields: EventFields = {
        "id": flow.id,
        "started": note.started,
        "method": request.method,
        "url": redact_url(url_of(request, note.host)),
        "scheme": request.scheme,
        "host": note.host,
        "port": request.port,
        "ip": None if verdict.refused or flow.is_replay else peer(flow.server_conn),
        "sni": flow.client_conn.sni,
        "http_version": request.http_version,
        "status": response.status_code if response is not None else 0,
        "request_headers": redact_headers(header_pairs(request.headers)),
        "response_headers": redact_headers(header_pairs(response.headers)) if response is not None else [],
        "mime": response.headers.get("content-type") if response is not None else None,
        "bytes_out": len(request.raw_content or b""),
        "bytes_in": len(response.raw_content or b"") if response is not None else 0,
        "duration_ms": round(max(0.0, ended - note.started) * 1000, 3),
        "decision": verdict.outcome,
        "rule": verdict.decision.rule,
        "reason": verdict.decision.reason,
    }
    fields.update(note.attribution.record())
    fields.update(note.extra)
    if flow.is_replay == "response":
        fields["replayed"] = True
    return fields


def _mitmproxy_version() -> str:
    from mitmproxy import version

    return str(version.VERSION)
