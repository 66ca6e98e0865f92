"""Which agent action a flow is charged to, and on whose word.

The controller reports the actions it runs (the control channel); a record names the latest one
in flight. That is wrong for commands: a build started by one ``exec`` keeps fetching while the
agent clicks, and two commands can run at once. So each command is given the proxy with its
``exec``'s action id as credentials (:mod:`corral.sandbox.agent.agentenv`): ``Proxy-Authorization:
Basic base64("corral-action:<id>")``, on the CONNECT of each tunnel and on each plain HTTP request.

A command can put any id there, so a record says whose word it took (``action_source``): the
command's own, or the controller's. A forged id only mislabels the agent's own traffic (the agent
could as well have made the request during another action); it changes no decision.

A flow with no credentials is never charged to a human (:func:`unvouched`): the proxy cannot tell
Chromium's requests from those of an agent process that leaves the credentials out, so a human's
action in flight would otherwise lend the agent's traffic the person's name. It is charged to the
latest action in flight that is not a human's, else to none (``action: null``): a person's own
browsing is then recorded as unattributed, never the other way round.

Pure: parsing only (the addon, :class:`corral.proxy.addons.ActionAttribution`, reads the flows).
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from dataclasses import dataclass
from typing import Literal

from corral.contracts.actors import is_human
from corral.contracts.control import ACTION_ID, PROXY_USER
from corral.proxy.audit import EventFields

ActionSource = Literal["command", "controller"]


@dataclass(frozen=True, slots=True)
class Attribution:
    """The action a flow is charged to (None: no action in flight), who named it, and who acted
    (``actor``: a human's or a CDP connection's action; None for the agent's)."""

    action: str | None
    source: ActionSource | None
    actor: str | None = None

    @classmethod
    def controller(cls, action: str | None, actor: str | None = None) -> Attribution:
        """The controller's action in flight (no source when there is none), and its actor."""
        return cls(action, "controller" if action is not None else None, actor if action is not None else None)

    @classmethod
    def command(cls, action: str) -> Attribution:
        return cls(action, "command")

    def record(self) -> EventFields:
        """What an audit record says of it: ``action``, and ``action_source: "command"`` when a
        command named it. Without that field the action is the controller's, as in every record
        written before commands could name one. ``actor`` only when not the agent's (records of the
        agent's actions are as before actors existed)."""
        if self.source == "command":
            return {"action": self.action, "action_source": "command"}
        if self.actor is not None:
            return {"action": self.action, "actor": self.actor}
        return {"action": self.action}


def unvouched(in_flight: list[tuple[str, str | None]]) -> Attribution:
    """What a flow that names no action is charged to, from the actions in flight (oldest first, each
    with its actor): the latest that is not a human's, else none (the module's text says why)."""
    for action, actor in reversed(in_flight):
        if not is_human(actor):
            return Attribution.controller(action, actor)
    return Attribution.controller(None)


def command_action(authorization: str) -> str | None:
    """The action id in a ``Proxy-Authorization`` value, or None when it names none: another
    scheme, another user, or an id that is not an action id (``[A-Za-z0-9_.:-]{1,64}``). An id
    sent still percent-encoded is decoded once (no action id holds ``%``)."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not colon or user != PROXY_USER:
        return None
    action = urllib.parse.unquote(password) if "%" in password else password
    return action if ACTION_ID.fullmatch(action) else None
