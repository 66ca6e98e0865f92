"""A tool's arguments checked before it runs, every problem named for the model that sent them (pure):
which argument, what is wrong with it, and what the tool expects there, as one tool error with the
code ``invalid_request`` (corral.mcp.results) instead of pydantic's own text.

The SDK would take arguments the tool has no parameter for and drop them silently (a ``keys`` where
``press_key`` takes ``key`` would then read "key: Field required", with nothing said of ``keys``), and
answer a wrong type with pydantic's multi-line report naming its internal model (``press_keyArguments``).
Here an unknown name is a problem of its own, with the name it most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from corral.errors import ErrorCode

# What a refusal repeats of the call is bounded: a name's first 64 characters, the first 20 problems
# (a call with a thousand stray arguments is answered in a few kilobytes, not a thousand lines).
_MAX_NAME = 64
MAX_PROBLEMS = 20


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with one argument: ``problem`` is ``unknown``, ``missing`` or ``invalid``."""

    argument: str
    problem: str
    detail: str
    expected: str


def expected(spec: Mapping[str, Any], required: bool) -> str:
    """What an argument's JSON schema asks, as a line for a model: type, bounds, default, meaning."""
    kinds = [_kind(part) for part in spec.get("anyOf", [spec])]
    kind = " or ".join(dict.fromkeys(kind for kind in kinds if kind)) or "any value"
    bounds = [
        f"{word} {spec[key]}"
        for key, word in (("minimum", ">="), ("maximum", "<="), ("minLength", "length >="), ("maxLength", "length <="))
        if key in spec
    ]
    head = ", ".join([kind, *bounds])
    tail = "required" if required else f"default {_shown(spec.get('default'))}"
    description = spec.get("description")
    return f"{head} ({tail})" + (f": {description}" if description else "")


def _kind(spec: Mapping[str, Any]) -> str:
    if "enum" in spec:
        return "one of " + ", ".join(_shown(value) for value in spec["enum"])
    if "const" in spec:
        return _shown(spec["const"])
    kind = spec.get("type")
    if kind == "array":
        return f"a list of {_kind(spec.get('items', {})) or 'values'}"
    if kind == "object":
        return "an object"
    return {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false"}.get(
        str(kind), ""
    )


def _shown(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def problems(tool: Tool, arguments: Mapping[str, Any]) -> list[Problem]:
    """Every problem of ``arguments`` for ``tool``: names it has no parameter for, then what its own
    validation (the SDK's, run here on the same model) refuses."""
    properties: Mapping[str, Any] = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    found: list[Problem] = []
    for name in arguments:
        if name not in properties:
            shown = name[:_MAX_NAME]
            close = difflib.get_close_matches(name, list(properties), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            accepted = ", ".join(properties)
            found.append(Problem(shown, "unknown", f"{tool.name} has no argument {shown}{hint}", f"one of {accepted}"))
    try:
        tool.fn_metadata.validate_arguments(dict(arguments))
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            name = str(error["loc"][0]) if error["loc"] else ""
            spec = properties.get(name, {})
            missing = error["type"] == "missing"
            detail = f"{name} is required" if missing else f"{name}: {error['msg']}"
            found.append(Problem(name, "missing" if missing else "invalid", detail, expected(spec, name in required)))
    return found


def refusal(tool: Tool, found: list[Problem]) -> CallToolResult:
    """The tool error for ``found``: one line per problem and what the tool takes, for the model; the
    problems, one object each, in ``structuredContent`` for programs."""
    properties: Mapping[str, Any] = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    more = len(found) - MAX_PROBLEMS
    found = found[:MAX_PROBLEMS]
    message = "; ".join(problem.detail for problem in found) + (f"; and {more} more" if more > 0 else "")
    lines = [f"{ErrorCode.INVALID_REQUEST}: {message}", f"{tool.name} takes:"]
    lines += [f"- {name}: {expected(spec, name in required)}" for name, spec in properties.items()]
    body = {
        "code": str(ErrorCode.INVALID_REQUEST),
        "message": message,
        "field": found[0].argument,
        "problems": [asdict(problem) for problem in found],
    }
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines))], structured_content={"error": body}, is_error=True
    )


__all__ = ["Problem", "expected", "problems", "refusal"]
