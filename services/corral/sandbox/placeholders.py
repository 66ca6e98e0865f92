"""The session's secret placeholders, as the gateway last put them: every command's environment holds
each under its secret's name (:mod:`corral.sandbox.agent.agentenv`), and the ``secrets`` action answers them.

A placeholder stands in for a value the sandbox never sees; the egress proxy puts the value in its
place on the way out, for the hosts the secret is bound to (docs/egress.md). Placeholders are not
secret (the agent is meant to hold them), but only the gateway may say which ones the session has:
``PUT /v1/secrets`` is behind the controller's door like every route (the per-boot secret, no
browser), and the agent's uid cannot even connect to the controller.

The set is kept in memory only: a restarted controller has none until the gateway puts them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from corral.contracts.placeholders import MAX_SECRETS, PLACEHOLDER, name_problem
from corral.errors import ActionError, ErrorCode

FIELD = "secrets"


class NamedValues:
    """Names to values, replaced whole by each ``PUT`` of the gateway's; read by each ``exec``. One
    event loop reads and writes it: a replacement is one assignment."""

    def __init__(self, by_name: Mapping[str, str] | None = None) -> None:
        self._by_name: Mapping[str, str] = MappingProxyType(dict(by_name or {}))

    @property
    def by_name(self) -> Mapping[str, str]:
        """The current set (read-only; a later replacement does not change what was handed out)."""
        return self._by_name

    def replace(self, by_name: Mapping[str, str]) -> None:
        self._by_name = MappingProxyType(dict(by_name))


class Placeholders(NamedValues):
    """Names to placeholders, replaced whole by each ``PUT /v1/secrets``; read by each ``exec`` and
    by the ``secrets`` action."""


def placeholders_of(body: Mapping[str, Any]) -> dict[str, str]:
    """The names and placeholders a ``PUT /v1/secrets`` body (``{"secrets": {"NAME": "corral_secret_..."}}``,
    the whole set) gives; raises :class:`ActionError` naming the field at fault. Pure."""
    unknown = sorted(set(body) - {FIELD})
    if unknown:
        raise ActionError(ErrorCode.UNKNOWN_FIELD, f"unknown field {unknown[0]!r}", field=unknown[0])
    if FIELD not in body:
        raise ActionError(ErrorCode.MISSING_FIELD, "give secrets: the names and placeholders, all of them", FIELD)
    given = body[FIELD]
    if not isinstance(given, dict):
        raise ActionError(ErrorCode.INVALID_FIELD, "secrets is an object of names to placeholders", FIELD)
    if len(given) > MAX_SECRETS:
        raise ActionError(ErrorCode.INVALID_FIELD, f"{len(given)} secrets; at most {MAX_SECRETS}", FIELD)
    owners: dict[str, str] = {}
    for name, placeholder in given.items():
        field = f"{FIELD}.{name}"
        problem = name_problem(name)
        if problem is not None:
            raise ActionError(ErrorCode.INVALID_FIELD, problem, field)
        if not isinstance(placeholder, str) or PLACEHOLDER.fullmatch(placeholder) is None:
            raise ActionError(ErrorCode.INVALID_FIELD, "a placeholder is corral_secret_ and 32 hex digits", field)
        if placeholder in owners:
            raise ActionError(ErrorCode.INVALID_FIELD, f"{owners[placeholder]} has the same placeholder", field)
        owners[placeholder] = name
    return dict(given)
