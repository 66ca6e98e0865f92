"""The session's environment variables (``env`` at create), as the gateway last put them: every
command the agent runs holds them (:mod:`corral.sandbox.agent.agentenv`).

They come after the claim (a pooled sandbox is already running when its session is made), by
``PUT /v1/env`` behind the controller's door like every route (the per-boot secret, no browser): the
agent's uid cannot even connect to the controller. The body is checked again here, whole, with the
rules the gateway used (corral.contracts.envvars): the controller trusts no malformed body. Kept in
memory only: a restarted controller has none until the gateway's watchdog puts them again
(``GET /v1/env`` answers the set's digest, never its values).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.contracts import envvars
from corral.errors import ActionError, ErrorCode
from corral.sandbox.placeholders import NamedValues

FIELD = "env"


class SessionEnv(NamedValues):
    """Names to values, replaced whole by each ``PUT /v1/env``; read by each ``exec``."""

    def digest(self) -> str:
        return envvars.digest(self._by_name)


def env_of(body: Mapping[str, Any]) -> dict[str, str]:
    """The variables a ``PUT /v1/env`` body (``{"env": {"NAME": "value"}}``, the whole set) gives;
    raises :class:`ActionError` naming the field at fault (never quoting a value). Pure."""
    unknown = sorted(set(body) - {FIELD})
    if unknown:
        raise ActionError(ErrorCode.UNKNOWN_FIELD, f"unknown field {unknown[0]!r}", field=unknown[0])
    if FIELD not in body:
        raise ActionError(ErrorCode.MISSING_FIELD, "give env: the names and values, all of them", FIELD)
    given = body[FIELD]
    if not isinstance(given, dict):
        raise ActionError(ErrorCode.INVALID_FIELD, "env is an object of names to values", FIELD)
    for name, value in given.items():
        if not isinstance(value, str):
            raise ActionError(ErrorCode.INVALID_FIELD, "an environment variable's value is a string", f"{FIELD}.{name}")
    problem = envvars.set_problem(given)
    if problem is not None:
        where, words = problem
        raise ActionError(ErrorCode.INVALID_FIELD, words, f"{FIELD}.{where}" if where else FIELD)
    return dict(given)
