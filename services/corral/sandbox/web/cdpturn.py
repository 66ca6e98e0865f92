"""A CDP connection during a person's turn: what it set up is let go at the take and set up again at
the hand-back, and nothing of the turn reaches it (docs/design/0269-cdp-in-a-persons-turn.md).

While a human holds the control lease, a connection that does not hold it (every connection but an
exclusive one whose lease the person did not take) is *muzzled*:

- from the take on, of Chromium's events only :data:`~corral.contracts.cdprules.PERSONS_TURN_EVENTS`
  reach it (a session went away); answers to the commands it had in flight at the take are
  answered at once with ``control_taken`` and Chromium's own answers to them dropped whenever
  they come (an ``awaitPromise`` evaluate resolved by the person's keystrokes);
- its commands are refused but for :func:`~corral.contracts.cdprules.allowed_in_persons_turn`;
- what it set up that would act on the person's pages goes: every session it is attached to is
  detached (Chromium then drops that session's Fetch interception, breakpoints and pause,
  ``waitForDebuggerOnStart``, scripts for new documents, bindings, Network and Runtime events),
  and what it set at the browser's own level (auto-attach, target discovery, Fetch, download
  behaviour) is switched off.

At the hand-back the browser-level settings are sent again as the client last gave them, so
Chromium attaches it again to every target (the person's new tabs too) and reports them as a new
connection would be told: a framework sees its pages close at the take and come back after.

Pure bookkeeping: :class:`Turn` says what to send and what to drop; the relay (corral.sandbox.web.cdp)
sends and drops.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, NotRequired, TypedDict

from corral.contracts import cdprules

# A command, as its response names it: (sessionId, id).
Pending = tuple[str | None, int]
# The relay's own commands on a client's socket take ids from here up (int32, far above any
# framework's counter, which starts at 1), so their answers are told from the client's.
OWN_IDS: Final = 2_000_000_000
_EVENT_HEAD = re.compile(r'\{\s*"method"\s*:\s*"([^"\\]{1,128})"')
_ENDS = 200
_ATTACHED, _DETACHED = "Target.attachedToTarget", "Target.detachedFromTarget"


@dataclass(frozen=True, slots=True)
class Own:
    """A command the relay sends on the client's socket for it (not the client's: never answered)."""

    method: str
    # Open-ended: CDP's parameters, often a client's own sent again as it gave them (auto-attach's
    # filter, Fetch's patterns); nothing here reads them.
    params: Mapping[str, object]
    session_id: str | None = None


class _Wire(TypedDict):
    """A command of the relay's own, as it goes to Chromium."""

    id: int
    method: str
    params: Mapping[str, object]
    sessionId: NotRequired[str]


def event_method(frame: str | bytes) -> str | None:
    """An event's method, read from the frame's head (Chromium writes ``{"method":...`` first)."""
    head = frame[:_ENDS]
    if isinstance(head, bytes):
        head = head.decode(errors="replace")
    found = _EVENT_HEAD.match(head)
    return found.group(1) if found else None


class Turn:
    """One connection's side of the person's turn: what it holds, and whether it is muzzled."""

    def __init__(self) -> None:
        self.muzzled = False
        self._sessions: set[str] = set()  # flat sessions Chromium attached it to
        self._targets: dict[str, str] = {}  # ... and the target each is attached to (Page.close names none)
        # The browser level's settings as the client last gave them: the commands to send again.
        self._auto_attach: Own | None = None
        self._discover: Own | None = None
        self._fetch: Own | None = None
        self._downloads: dict[str | None, Own] = {}  # by browserContextId
        self._in_flight: set[Pending] = set()
        self._cut: set[Pending] = set()  # answered at the take: Chromium's answers are dropped
        self._own: set[int] = set()
        self._next_own = OWN_IDS

    # -- what the client sends and Chromium says

    def sent(self, command: cdprules.Command) -> None:
        """``command`` is on its way to Chromium: in flight (so a take from now on cuts it)."""
        self._in_flight.add((command.session_id, command.id))

    def goes(self, command: cdprules.Command) -> bool:
        """Whether ``command``, :meth:`sent` a moment ago, still goes to Chromium: not when a take cut
        it meanwhile (it was answered ``control_taken``; sent now it would act in the person's turn).
        What a going command sets at the browser's level is kept, to set it up again after a turn."""
        pending = (command.session_id, command.id)
        if pending in self._cut:
            self._cut.discard(pending)
            return False
        if command.session_id is not None:
            return True
        params = command.params or {}
        match command.method:
            case "Target.setAutoAttach":
                self._auto_attach = Own(command.method, dict(params)) if params.get("autoAttach") is True else None
            case "Target.setDiscoverTargets":
                self._discover = Own(command.method, dict(params)) if params.get("discover") is True else None
            case "Fetch.enable":
                self._fetch = Own(command.method, dict(params))
            case "Fetch.disable":
                self._fetch = None
            case "Browser.setDownloadBehavior":
                context = params.get("browserContextId")
                key = context if isinstance(context, str) else None
                # Corral's own place with events on (downloads_in_place) is still the client's setting:
                # its events go at the take and come back at the hand-back.
                if params.get("behavior") == "default" and params.get("eventsEnabled") is not True:
                    self._downloads.pop(key, None)
                else:
                    self._downloads[key] = Own(command.method, dict(params))
        return True

    def answered(self, answered: Pending) -> bool:
        """Chromium answered ``answered``: whether the client may have the answer (not the relay's
        own command's, nor one cut at the take)."""
        self._in_flight.discard(answered)
        if answered[1] in self._own:
            self._own.discard(answered[1])
            return False
        if answered in self._cut:
            self._cut.discard(answered)
            return False
        return True

    def event(self, frame: str | bytes) -> tuple[bool, list[Own]]:
        """Chromium's event ``frame``: whether it reaches the client, and what the relay must send
        (a session attached during the turn is let go at once)."""
        method = event_method(frame)
        if method in (_ATTACHED, _DETACHED):
            session, target = _session_of(frame)
            if session is not None and method == _ATTACHED:
                self._sessions.add(session)
                if target is not None:
                    self._targets[session] = target
                if self.muzzled:
                    return False, [Own("Target.detachFromTarget", {"sessionId": session})]
            elif session is not None:
                self._sessions.discard(session)
                self._targets.pop(session, None)
        if not self.muzzled:
            return True, []
        return method in cdprules.PERSONS_TURN_EVENTS, []

    def target_of(self, session: str) -> str | None:
        """The target Chromium attached this connection's ``session`` to, if it said."""
        return self._targets.get(session)

    # -- the turn

    def begin(self) -> list[Pending]:
        """The person took the lease: muzzled from now; the commands in flight, to be answered
        ``control_taken`` now (Chromium's answers to them are dropped)."""
        self.muzzled = True
        cut = sorted(self._in_flight, key=lambda p: (p[0] or "", p[1]))
        self._cut |= self._in_flight
        self._in_flight = set()
        return cut

    def let_go(self) -> list[Own]:
        """What to send at the take: browser-level settings off first (no new session), then every
        session detached."""
        out: list[Own] = []
        if self._auto_attach is not None:
            out.append(
                Own("Target.setAutoAttach", {"autoAttach": False, "waitForDebuggerOnStart": False, "flatten": True})
            )
        if self._discover is not None:
            out.append(Own("Target.setDiscoverTargets", {"discover": False}))
        if self._fetch is not None:
            out.append(Own("Fetch.disable", {}))
        for context in self._downloads:
            out.append(Own("Browser.setDownloadBehavior", _default_downloads(context)))
        out += [Own("Target.detachFromTarget", {"sessionId": s}) for s in sorted(self._sessions)]
        return out

    def end(self) -> list[Own]:
        """The lease left the person: no longer muzzled; what to send to set up again what was let go
        (auto-attach last: Chromium attaches every target then, as to a new connection)."""
        self.muzzled = False
        out = list(self._downloads.values())
        for setting in (self._fetch, self._discover, self._auto_attach):
            if setting is not None:
                out.append(setting)
        return out

    def own_wire(self, own: Own) -> str:
        """``own`` as it goes to Chromium, with an id of the relay's."""
        self._next_own += 1
        if self._next_own > 2**31 - 1:
            self._next_own = OWN_IDS
        self._own.add(self._next_own)
        out = _Wire(id=self._next_own, method=own.method, params=own.params)
        if own.session_id is not None:
            out["sessionId"] = own.session_id
        return json.dumps(out, separators=(",", ":"))


# What a client may ask for that saves files where it says: Corral saves them in its own place instead.
_SAVING = frozenset({"allow", "allowAndName"})
_DOWNLOAD_BEHAVIOUR = frozenset({"Browser.setDownloadBehavior", "Page.setDownloadBehavior"})


def downloads_in_place(command: cdprules.Command) -> cdprules.Command:
    """``command`` as it goes to Chromium: a client's download behaviour that saves (``allow``,
    ``allowAndName``, with a ``downloadPath`` of the client's machine, which is no path in the sandbox)
    becomes Chromium's ``default`` (the managed policy's ``~/Downloads``, where Corral lists and serves
    every download: docs/downloads.md), keeping the client's context and ``eventsEnabled``, so it still
    gets ``Browser.downloadWillBegin`` and ``downloadProgress`` with their GUIDs. ``deny`` and
    ``default`` go as they came; any other command unchanged."""
    params = command.params or {}
    if command.method not in _DOWNLOAD_BEHAVIOUR or params.get("behavior") not in _SAVING:
        return command
    kept: dict[str, object] = {"behavior": "default"}
    for name in ("browserContextId", "eventsEnabled"):
        if name in params and command.method == "Browser.setDownloadBehavior":
            kept[name] = params[name]
    return replace(command, params=kept)


def _default_downloads(context: str | None) -> dict[str, str]:
    out = {"behavior": "default"}
    if context is not None:
        out["browserContextId"] = context
    return out


def _session_of(frame: str | bytes) -> tuple[str | None, str | None]:
    """The session an attach (or detach) event names, and its target's id (a small frame: decoded whole)."""
    try:
        params = json.loads(frame).get("params") or {}
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(params, dict):
        return None, None
    session, info = params.get("sessionId"), params.get("targetInfo")
    target = info.get("targetId") if isinstance(info, dict) else params.get("targetId")
    return (session if isinstance(session, str) else None), (target if isinstance(target, str) else None)


__all__ = ["OWN_IDS", "Own", "Pending", "Turn", "downloads_in_place", "event_method"]
