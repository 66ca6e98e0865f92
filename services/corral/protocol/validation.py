"""Pydantic validation errors to Corral's structured :class:`ActionError`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from corral.errors import ActionError, ErrorCode

T = TypeVar("T")

_CODE_BY_PYDANTIC_TYPE: Mapping[str, ErrorCode] = {
    "missing": ErrorCode.MISSING_FIELD,
    "missing_field": ErrorCode.MISSING_FIELD,
    "union_tag_not_found": ErrorCode.MISSING_FIELD,
    "union_tag_invalid": ErrorCode.UNKNOWN_ACTION,
    "extra_forbidden": ErrorCode.UNKNOWN_FIELD,
    "unknown_key": ErrorCode.UNKNOWN_KEY,
    "text_too_long": ErrorCode.TEXT_TOO_LONG,
    "invalid_field": ErrorCode.INVALID_FIELD,
    "url_refused": ErrorCode.URL_REFUSED,
}


def _is_union_member(part: int | str) -> bool:
    """Whether a location part names a member of a plain union (``bool``, ``constrained-str``, a model), not a field.

    Every field of the protocol's models is a lower-case identifier other than these scalar names.
    """
    return isinstance(part, str) and (
        part in ("bool", "int", "float", "str") or not part.isidentifier() or part[:1].isupper()
    )


def _member_positions(error: Any) -> list[int]:
    """Where ``error``'s location names union members; an unknown field's own name is the client's, never one."""
    loc = tuple(error["loc"])
    ours = loc[:-1] if error["type"] == "extra_forbidden" else loc
    return [i for i, part in enumerate(ours) if _is_union_member(part)]


def _first_error(errors: list[Any]) -> Any:
    """The error to report: the first, or for a plain union (``bool | ScreenshotOptions``) the error of the
    member the input was meant for (``screenshot.width`` is too small, rather than ``screenshot`` is no boolean)."""
    first = errors[0]
    members = _member_positions(first)
    if not members:
        return first
    head = tuple(first["loc"])[: members[0]]
    same_union = [e for e in errors if tuple(e["loc"])[: len(head)] == head]

    def relevance(error: Any) -> tuple[bool, int]:
        where = tuple(error["loc"])
        wrong_type = str(error["type"]).endswith(("_type", "_parsing")) and len(where) - 1 in _member_positions(error)
        return not wrong_type, len(where)

    return max(same_union, key=relevance)


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else str(part))
    return out


def error_from_validation(exc: ValidationError, prefix: str, tagged: bool) -> ActionError:
    """The first error of ``exc`` as an :class:`ActionError` whose field is a path under ``prefix``.

    ``tagged``: the model was a discriminated union, whose error locations start with the tag.
    """
    first = _first_error(exc.errors(include_url=False))
    kind = first["type"]
    members = _member_positions(first)
    loc = tuple(part for i, part in enumerate(first["loc"]) if i not in members)
    if tagged and kind not in ("union_tag_invalid", "union_tag_not_found") and loc:
        loc = loc[1:]
    code = _CODE_BY_PYDANTIC_TYPE.get(kind, ErrorCode.INVALID_FIELD)
    field = _path(prefix, loc)
    message = first["msg"]
    if kind == "union_tag_invalid":
        ctx = first.get("ctx") or {}
        field = _path(prefix, ("type",))
        message = f"unknown action type {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        field = _path(prefix, ("type",))
        message = "the action has no 'type'"
    elif kind == "missing":
        message = f"missing required field {field!r}"
    elif kind == "extra_forbidden":
        message = f"unknown field {field!r}"
    elif kind == "model_type" or kind == "dict_type":
        message = f"{field or 'the message'} must be a JSON object"
    # A missing x/y pair is reported on the action; name the coordinate itself.
    if kind == "missing_field" and isinstance(first.get("ctx"), dict) and "missing" in first["ctx"]:
        field = _path(field, (first["ctx"]["missing"],))
    return ActionError(code, message, field=field or None)


def validate(adapter: TypeAdapter[T], data: Any, prefix: str, *, tagged: bool = False) -> T:
    """Validate ``data`` with ``adapter``, raising a structured :class:`ActionError`."""
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise error_from_validation(exc, prefix, tagged) from None
