"""What a CDP client may not ask of the sandbox's Chromium, and the CDP errors that say so.

Pure: no I/O. The relay (corral.sandbox.cdp) asks :func:`refusal` of every client command and
:func:`needs_lease` of the ones it lets through; a refused command is answered with
:func:`refused_reply` or :func:`control_taken_reply` and never reaches Chromium.

Refused outright (whoever holds the lease), because each would take away a guarantee of Corral's:
the browser's life (the init restarts Chromium, but a client that crashes it at will breaks the
agent's session), the egress proxy (a browser context of its own proxy settings would bypass the
audit), and the network (port forwarding and remote locations reach past the proxy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

# The largest CDP message either hop (client to gateway, gateway to controller) carries: a full-page
# screenshot or a large DOM snapshot is tens of MiB. The agent's channel keeps its own limit
# (corral.protocol.envelope.MAX_FRAME_BYTES).
CDP_MAX_FRAME_BYTES: Final = 64 << 20

# JSON-RPC server error codes, as Chromium's own (-32000) and one of ours beside it.
REFUSED_CODE: Final = -32000
CONTROL_TAKEN_CODE: Final = -32001


@dataclass(frozen=True, slots=True)
class Rule:
    """A refusal: its name (in the error message, the recording and docs/cdp.md) and why."""

    name: str
    why: str


BROWSER_LIFECYCLE = Rule("browser_lifecycle", "the sandbox's browser is not the client's to close or crash")
PROXY_SETTINGS = Rule("proxy_settings", "a browser context must use the session's egress proxy")
DEVTOOLS_TO_PAGE = Rule("devtools_to_page", "a page must not be given the DevTools protocol")
NETWORK_BYPASS = Rule("network_bypass", "connections must go through the session's egress proxy")

RULES: Final[tuple[Rule, ...]] = (BROWSER_LIFECYCLE, PROXY_SETTINGS, DEVTOOLS_TO_PAGE, NETWORK_BYPASS)

_REFUSED_METHODS: Final[dict[str, Rule]] = {
    "Browser.close": BROWSER_LIFECYCLE,
    "Browser.crash": BROWSER_LIFECYCLE,
    "Browser.crashGpuProcess": BROWSER_LIFECYCLE,
    "Target.exposeDevToolsProtocol": DEVTOOLS_TO_PAGE,
    "Target.setRemoteLocations": NETWORK_BYPASS,
}
_REFUSED_DOMAINS: Final[dict[str, Rule]] = {"Tethering": NETWORK_BYPASS}
# Target.createBrowserContext's parameters that set a context's own network path.
_PROXY_PARAMS: Final = ("proxyServer", "proxyBypassList", "originsWithUniversalNetworkAccess")

# What drives the screen or the page: refused while another holds the control lease.
_LEASED_DOMAINS: Final = frozenset({"Input"})
_LEASED_METHODS: Final = frozenset(
    {
        "Page.navigate",
        "Page.reload",
        "Page.navigateToHistoryEntry",
        "Runtime.evaluate",
        "Runtime.callFunctionOn",
        "Target.createTarget",
        "Target.closeTarget",
        "Target.activateTarget",
    }
)


def _domain(method: str) -> str:
    return method.partition(".")[0]


def refusal(method: str, params: dict[str, Any] | None) -> Rule | None:
    """The rule that refuses ``method`` with ``params``, or None when it may reach Chromium."""
    rule = _REFUSED_METHODS.get(method) or _REFUSED_DOMAINS.get(_domain(method))
    if rule is not None:
        return rule
    if method == "Target.createBrowserContext" and params and any(params.get(p) is not None for p in _PROXY_PARAMS):
        return PROXY_SETTINGS
    return None


def needs_lease(method: str) -> bool:
    """Whether ``method`` drives the screen or the page, so only the lease's holder (or anyone, while
    the agent holds it) may send it."""
    return method in _LEASED_METHODS or _domain(method) in _LEASED_DOMAINS


def _reply(message_id: Any, session_id: str | None, code: int, text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"id": message_id}
    if session_id is not None:
        out["sessionId"] = session_id
    out["error"] = {"code": code, "message": text}
    return out


def refused_reply(message_id: Any, session_id: str | None, method: str, rule: Rule) -> dict[str, Any]:
    """The answer to a refused command, as Chromium answers a failed one."""
    return _reply(message_id, session_id, REFUSED_CODE, f"corral refused {method}: {rule.why} (rule {rule.name})")


def control_taken_reply(message_id: Any, session_id: str | None, holder: str, since: float) -> dict[str, Any]:
    """The answer to a lease-gated command while ``holder`` holds the lease (since unix seconds)."""
    return _reply(message_id, session_id, CONTROL_TAKEN_CODE, f"control_taken: held by {holder} since {since}")


def invalid_reply(message_id: Any, text: str) -> dict[str, Any]:
    """The answer to a message that is no CDP command (Chromium's own code for it)."""
    return _reply(message_id, None, -32600, text)


@dataclass(frozen=True, slots=True)
class Command:
    """A client's CDP command, as the relay reads it."""

    id: Any
    method: str
    params: dict[str, Any] | None
    session_id: str | None


def parse(message: Any) -> Command | str:
    """A decoded client message as a :class:`Command`, or why it is not one."""
    if not isinstance(message, dict):
        return "a CDP message is a JSON object"
    method, params, session_id = message.get("method"), message.get("params"), message.get("sessionId")
    if not isinstance(method, str) or not method:
        return "a CDP command has a method"
    if params is not None and not isinstance(params, dict):
        return "a CDP command's params are an object"
    if session_id is not None and not isinstance(session_id, str):
        return "a CDP command's sessionId is a string"
    if not isinstance(message.get("id"), int):
        return "a CDP command has an integer id"
    return Command(message["id"], method, params, session_id)


__all__ = [
    "CDP_MAX_FRAME_BYTES",
    "CONTROL_TAKEN_CODE",
    "REFUSED_CODE",
    "RULES",
    "Command",
    "Rule",
    "control_taken_reply",
    "invalid_reply",
    "needs_lease",
    "parse",
    "refusal",
    "refused_reply",
]
