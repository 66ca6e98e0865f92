"""Who acted, as every part names it: the controller's lease and recorder, the gateway's callers,
the proxy's audit and response store, the recording's redaction.

``agent`` (the session token), ``human:<link id>`` or ``human:owner`` (a person holding the control
lease through a viewer), ``cdp:<conn id>`` (an exclusive CDP connection)."""

from __future__ import annotations

from typing import Final

AGENT: Final = "agent"
HUMAN_PREFIX: Final = "human:"
CDP_PREFIX: Final = "cdp:"


def human(who: str) -> str:
    """A person's actor: ``who`` is a viewer link's id, or ``owner`` for the owner's API key."""
    return f"{HUMAN_PREFIX}{who}"


def is_human(actor: str | None) -> bool:
    return actor is not None and actor.startswith(HUMAN_PREFIX)


def is_cdp(actor: str | None) -> bool:
    return actor is not None and actor.startswith(CDP_PREFIX)
