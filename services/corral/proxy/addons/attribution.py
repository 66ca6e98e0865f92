"""Attribution: each flow charged to the agent action that caused it, before the policy decides it
(:mod:`corral.proxy.attribution` says why a command names its own action).

- A CONNECT that names an action (``Proxy-Authorization: Basic base64("corral-action:<id>")``)
  charges its tunnel to it: every request inside inherits the tunnel's action.
- A plain HTTP request that names one is charged to it.
- Anything else is charged to its tunnel's action, else the controller's latest action in flight that
  is not a human's, else none: a flow without credentials is never charged to a person.

Every ``Proxy-Authorization`` header is taken off the request here, first of all (this proxy asks
no client for credentials): none goes upstream, into a recorded response, or into the audit log.
"""

from __future__ import annotations

from mitmproxy import http

from corral.proxy.addons.state import ATTRIBUTION, Shared
from corral.proxy.attribution import Attribution, command_action

PROXY_AUTHORIZATION = "proxy-authorization"


class ActionAttribution:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def http_connect(self, flow: http.HTTPFlow) -> None:
        named = take_credentials(flow.request.headers)
        if named is not None:
            self.shared.connections.commands[flow.client_conn.id] = Attribution.command(named)
        flow.metadata[ATTRIBUTION] = self.shared.charged_to(flow.client_conn.id)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        named = take_credentials(flow.request.headers)
        attribution = Attribution.command(named) if named is not None else self.shared.charged_to(flow.client_conn.id)
        flow.metadata[ATTRIBUTION] = attribution


def take_credentials(headers: http.Headers) -> str | None:
    """Removes every ``Proxy-Authorization`` header; the action id the first one that names one
    names, or None."""
    values = headers.get_all(PROXY_AUTHORIZATION)
    if not values:
        return None
    del headers[PROXY_AUTHORIZATION]
    return next((action for action in map(command_action, values) if action is not None), None)
