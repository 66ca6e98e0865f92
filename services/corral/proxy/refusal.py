"""The answer an agent gets when egress refuses a request: a page that names the rule, or JSON for
clients that ask for JSON. A hermetic replay's "not in the recording" is the same answer with its
own rule (:data:`NOT_RECORDED`)."""

from __future__ import annotations

import html
import json

from mitmproxy import http

from corral.proxy.policy import Decision

NOT_RECORDED = "not-recorded"


def refusal_response(status: int, host: str, decision: Decision, accept: str) -> http.Response:
    """The page (or JSON body, for clients that ask for JSON) an agent sees when egress refuses."""
    unrecorded = decision.rule == NOT_RECORDED
    headers = {
        "Cache-Control": "no-store",
        "X-Corral-Egress": "not-recorded" if unrecorded else "denied",
        "X-Corral-Rule": decision.rule or "",
    }
    if "application/json" in accept and "text/html" not in accept:
        code = "not_recorded" if unrecorded else "egress_denied"
        error = {"code": code, "host": host, "rule": decision.rule, "reason": decision.reason}
        headers["Content-Type"] = "application/json"
        return http.Response.make(status, json.dumps({"error": error}).encode(), headers)
    headers["Content-Type"] = "text/html; charset=utf-8"
    return http.Response.make(status, _page(host, decision, unrecorded).encode(), headers)


def _page(host: str, decision: Decision, unrecorded: bool) -> str:
    title = "Not recorded" if unrecorded else "Blocked by Corral"
    heading = "Not in the recording" if unrecorded else "Blocked by Corral&#39;s egress policy"
    advice = (
        "This hermetic replay answers only what the recorded session fetched."
        if unrecorded
        else "A brokered secret goes only where the session's owner bound it."
        if (decision.rule or "").startswith("secret-")
        else "Ask the session's owner to add the host to the session's allowlist."
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}: {html.escape(host)}</title></head><body>"
        f"<h1>{heading}</h1>"
        f"<p id='reason'>{html.escape(decision.reason)}</p>"
        f"<p>Host: <code id='host'>{html.escape(host)}</code><br>"
        f"Rule: <code id='rule'>{html.escape(decision.rule or '')}</code></p>"
        f"<p>{advice}</p>"
        "</body></html>"
    )
