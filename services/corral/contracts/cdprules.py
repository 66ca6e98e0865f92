"""What a CDP client may not ask of the sandbox's Chromium, and the CDP errors that say so.

Pure: no I/O. The relay (corral.sandbox.web.cdp) asks :func:`refusal` of every client command and
:func:`needs_lease` of the ones it lets through; a refused command is answered with
:func:`refused_reply` or :func:`control_taken_reply` and never reaches Chromium.

``Browser.close`` (:data:`ENDS_CONNECTION`) is answered here with success and ends that client's
connection, as hosted browsers answer it: Chromium is the session's and keeps running
(docs/design/0381-closing-the-last-page.md).

Refused outright (whoever holds the lease), because each would take away a guarantee of Corral's:
the browser's life (the init restarts Chromium, but a client that crashes it at will breaks the
agent's session), the egress proxy (a browser context of its own proxy settings would bypass the
audit), the network (port forwarding and remote locations reach past the proxy), Chromium's own
pages (chrome://crash, chrome://quit, devtools://...), and non-flat sessions (a command carried
inside a string would reach a page unchecked).

While another connection holds the control lease a connection may only read and attach
(:func:`needs_lease`): an allowlist, so a method this module never heard of waits for the lease.
While a person holds it (a human's turn) far less: a connection may only let go of what it holds
(:func:`allowed_in_persons_turn`), and only the events that say it was let go reach it
(:data:`PERSONS_TURN_EVENTS`); corral.sandbox.web.cdpturn tears down and restores the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, NotRequired, TypedDict

from corral.contracts.limits import CDP_MAX_FRAME_BYTES
from corral.contracts.urls import web_url

# A client's command is far smaller (the largest are scripts and Fetch.fulfillRequest bodies); the
# relay decodes and re-encodes each one, so its size is bounded well below the browser's.
CDP_MAX_COMMAND_BYTES: Final = 16 << 20

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
FLAT_SESSIONS = Rule("flat_sessions", "a target's commands go in flat sessions (flatten: true), where each is checked")
INTERNAL_PAGES = Rule("internal_pages", "only http, https, data:, blob: and about:blank pages are the client's to open")

RULES: Final[tuple[Rule, ...]] = (
    BROWSER_LIFECYCLE,
    PROXY_SETTINGS,
    DEVTOOLS_TO_PAGE,
    NETWORK_BYPASS,
    FLAT_SESSIONS,
    INTERNAL_PAGES,
)

# A client's "close the browser": its connection ends, the browser stays (the relay answers it).
ENDS_CONNECTION: Final = frozenset({"Browser.close"})
# Commands of a page that only a shown tab answers: headful Chromium draws no frame for a tab behind
# another, so a screenshot of it waits for ever (Playwright's timed out). The relay brings the tab to
# the front first (Page.bringToFront in the same session), where the connection may act
# (docs/design/0382-screenshots-of-background-tabs.md).
BROUGHT_FORWARD: Final = frozenset({"Page.captureScreenshot"})
_REFUSED_METHODS: Final[dict[str, Rule]] = {
    "Browser.crash": BROWSER_LIFECYCLE,
    "Browser.crashGpuProcess": BROWSER_LIFECYCLE,
    "Page.crash": BROWSER_LIFECYCLE,
    "Target.exposeDevToolsProtocol": DEVTOOLS_TO_PAGE,
    "Target.setRemoteLocations": NETWORK_BYPASS,
    # A command inside a string (non-flat sessions) would pass every rule and the lease unread.
    "Target.sendMessageToTarget": FLAT_SESSIONS,
    "Target.openDevTools": INTERNAL_PAGES,
}
_REFUSED_DOMAINS: Final[dict[str, Rule]] = {"Tethering": NETWORK_BYPASS}
# Target.createBrowserContext's parameters that set a context's own network path.
_PROXY_PARAMS: Final = ("proxyServer", "proxyBypassList", "originsWithUniversalNetworkAccess")
# Commands that open a session, non-flat unless asked (Chromium's default is false). Playwright,
# Puppeteer, browser-use and Playwright MCP all pass flatten: true.
_ATTACHING: Final = frozenset({"Target.attachToTarget", "Target.setAutoAttach"})
# Commands that open a URL the client names: web pages only, the rule native navigate has too
# (corral.contracts.urls: chrome:// crashes, kills, hangs, quits; devtools://, file://, javascript:...).
_OPENING: Final = frozenset({"Page.navigate", "Target.createTarget"})


def _domain(method: str) -> str:
    return method.partition(".")[0]


def refusal(method: str, params: dict[str, Any] | None) -> Rule | None:
    """The rule that refuses ``method`` with ``params``, or None when it may reach Chromium."""
    rule = _REFUSED_METHODS.get(method) or _REFUSED_DOMAINS.get(_domain(method))
    if rule is not None:
        return rule
    given = params or {}
    if method == "Target.createBrowserContext" and any(given.get(p) is not None for p in _PROXY_PARAMS):
        return PROXY_SETTINGS
    if method in _ATTACHING and given.get("flatten") is not True:
        return FLAT_SESSIONS
    if method in _OPENING:
        url = given.get("url", "")
        if not isinstance(url, str) or not web_url(url):
            return INTERNAL_PAGES
    return None


# What a connection may send while another holds the control lease: it reads, it attaches, and it
# sets up what a framework needs to connect (Playwright's connect_over_cdp sends exactly these
# besides reads; tests/integration/test_cdp.py connects while a human holds the lease). Anything
# else may act on the page, so it waits for the lease.
_WHILE_HELD: Final = frozenset(
    {
        "DOM.describeNode",
        "DOM.querySelector",
        "DOM.querySelectorAll",
        "DOM.resolveNode",
        "DOM.requestNode",
        "DOM.pushNodesByBackendIdsToFrontend",
        "Page.captureScreenshot",
        "Page.captureSnapshot",
        "Page.createIsolatedWorld",
        "Page.setLifecycleEventsEnabled",
        "Page.setFontFamilies",
        "Emulation.setFocusEmulationEnabled",
        "Emulation.setEmulatedMedia",
        "Browser.setDownloadBehavior",
        "Runtime.runIfWaitingForDebugger",
        "Runtime.releaseObject",
        "Runtime.releaseObjectGroup",
        "Target.attachToTarget",
        "Target.attachToBrowserTarget",
        "Target.autoAttachRelated",
        "Target.detachFromTarget",
        "Target.setAutoAttach",
        "Target.setDiscoverTargets",
    }
)
# Domains whose every command acts (Input.* is the mouse and the keyboard), whatever its name.
_ACTING_DOMAINS: Final = frozenset({"Input"})
# Fetch.continueRequest that changes nothing lets a request paused by the client's own Fetch.enable
# go on as it was (refused, the page would hang until the lease came back).
_UNCHANGED_CONTINUE: Final = frozenset({"requestId"})


def _reads(verb: str) -> bool:
    """``enable``, ``disable`` and ``get<Something>``: a domain's events, or a read."""
    return verb in ("enable", "disable") or (verb.startswith("get") and verb[3:4].isupper())


def needs_lease(method: str, params: dict[str, Any] | None = None) -> bool:
    """Whether ``method`` with ``params`` may act on the browser, so only the lease's holder (or
    anyone, while the agent holds it) may send it."""
    domain, _, verb = method.partition(".")
    if domain in _ACTING_DOMAINS:
        return True
    if method in _WHILE_HELD or _reads(verb):
        return False
    if method == "Page.addScriptToEvaluateOnNewDocument":
        return bool((params or {}).get("source"))  # an empty script names a world (Playwright's utility world)
    if method == "Fetch.continueRequest":
        return not set(params or {}) <= _UNCHANGED_CONTINUE
    return True


# While a person holds the lease, a connection other than the holder may send only what reads nothing
# of the page and lets go of what it holds: the person's input, the page it goes into and the
# traffic it makes are not the connection's to see (docs/design/0269-cdp-in-a-persons-turn.md).
_IN_PERSONS_TURN: Final = frozenset(
    {
        "Browser.getVersion",
        "Target.detachFromTarget",
        "Runtime.releaseObject",
        "Runtime.releaseObjectGroup",
    }
)
# ... and of Chromium's events only these, which name a session that went away and nothing of a page.
PERSONS_TURN_EVENTS: Final = frozenset({"Target.detachedFromTarget", "Inspector.detached"})


def allowed_in_persons_turn(method: str) -> bool:
    """Whether a connection that does not hold the lease may send ``method`` while a person holds it:
    a ``*.disable`` (giving something up), a detach, the browser's version, releasing its objects."""
    return method in _IN_PERSONS_TURN or method.partition(".")[2] == "disable"


class CdpError(TypedDict):
    code: int
    message: str


class CdpOkReply(TypedDict):
    """A success the relay answers itself (Browser.close: nothing to return)."""

    id: int
    sessionId: NotRequired[str]
    result: dict[str, object]


class CdpErrorReply(TypedDict):
    """An answer the relay gives itself, as Chromium answers a failed command."""

    id: int | None  # None: the message had no id Chromium takes
    sessionId: NotRequired[str]
    error: CdpError


class CdpCommand(TypedDict):
    """A command as it goes to Chromium (:meth:`Command.wire`)."""

    id: int
    method: str
    params: NotRequired[dict[str, Any]]  # CDP's own, open-ended per method: checked by the rules above
    sessionId: NotRequired[str]


def _reply(message_id: int | None, session_id: str | None, code: int, text: str) -> CdpErrorReply:
    error: CdpError = {"code": code, "message": text}
    if session_id is None:
        return {"id": message_id, "error": error}
    return {"id": message_id, "sessionId": session_id, "error": error}


def ok_reply(message_id: int, session_id: str | None) -> CdpOkReply:
    """An empty success, as Chromium answers a command that returns nothing."""
    if session_id is None:
        return {"id": message_id, "result": {}}
    return {"id": message_id, "sessionId": session_id, "result": {}}


def refused_reply(message_id: int | None, session_id: str | None, method: str, rule: Rule) -> CdpErrorReply:
    """The answer to a refused command, as Chromium answers a failed one."""
    return _reply(message_id, session_id, REFUSED_CODE, f"corral refused {method}: {rule.why} (rule {rule.name})")


def control_taken_reply(message_id: int | None, session_id: str | None, holder: str, since: float) -> CdpErrorReply:
    """The answer to a lease-gated command while ``holder`` holds the lease (since unix seconds)."""
    return _reply(message_id, session_id, CONTROL_TAKEN_CODE, f"control_taken: held by {holder} since {since}")


def invalid_reply(message_id: int | None, text: str) -> CdpErrorReply:
    """The answer to a message that is no CDP command (Chromium's own code for it)."""
    return _reply(message_id, None, -32600, text)


@dataclass(frozen=True, slots=True)
class Command:
    """A client's CDP command, as the relay reads it."""

    id: int
    method: str
    params: dict[str, Any] | None
    session_id: str | None

    def wire(self) -> CdpCommand:
        """The command as it goes to Chromium: what was read and checked, nothing else."""
        out: CdpCommand = {"id": self.id, "method": self.method}
        if self.params is not None:
            out["params"] = self.params
        if self.session_id is not None:
            out["sessionId"] = self.session_id
        return out


_MIN_ID, _MAX_ID = -(2**31), 2**31 - 1


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # Chromium keeps the last of a repeated key and a checker might read the first: never both.
        raise ValueError("a CDP message repeats a key")
    return out


def loads(frame: str) -> Any:
    """A client's frame decoded as JSON, refusing repeated keys and nesting past the parser's
    recursion (ValueError)."""
    try:
        return json.loads(frame, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("a CDP message nests too deep") from None


def id_of(message: Any) -> int | None:
    """A decoded message's id, if it is one Chromium takes: a 32-bit integer (JSON's true is none,
    though Python's bool is an int)."""
    found = message.get("id") if isinstance(message, dict) else None
    return found if type(found) is int and _MIN_ID <= found <= _MAX_ID else None


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
    message_id = id_of(message)
    if message_id is None:
        return "a CDP command has an integer id"
    return Command(message_id, method, params, session_id)


__all__ = [
    "BROUGHT_FORWARD",
    "CDP_MAX_COMMAND_BYTES",
    "CDP_MAX_FRAME_BYTES",
    "CONTROL_TAKEN_CODE",
    "ENDS_CONNECTION",
    "PERSONS_TURN_EVENTS",
    "REFUSED_CODE",
    "RULES",
    "Command",
    "Rule",
    "allowed_in_persons_turn",
    "control_taken_reply",
    "id_of",
    "invalid_reply",
    "loads",
    "needs_lease",
    "ok_reply",
    "parse",
    "refusal",
    "refused_reply",
    "web_url",
]
