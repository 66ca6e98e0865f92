"""A kernel's MIME bundles and errors as run_code's results, pure: only the types a result carries
(:data:`corral.protocol.results.CodeMime`), each a string, what is too big or unknown named in
``omitted``; tracebacks without ANSI colours; everything cut to a size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import get_args

from corral.protocol import results as r

MIME_TYPES: frozenset[str] = frozenset(get_args(r.CodeMime))
# The MIME types kept whatever the budget (cut short if they must be): a result always says what it is.
KEPT_TEXT = "text/plain"
MAX_TEXT_PLAIN_BYTES = 64 << 10  # a result's text/plain past this is cut (a repr of a huge object)
# What a result's text/plain may take even once the results' budget is spent (the frame has room for
# collect.MAX_RESULTS of them): every result says what it is.
TEXT_RESERVE = 256
MAX_OMITTED = 32  # the names of left-out types kept per result
MAX_MIME_NAME = 128
MAX_ERROR_NAME = 256
MAX_ERROR_VALUE = 16 << 10
MAX_TRACEBACK = 256 << 10
CUT = "\n[... cut by corral]"

# CSI sequences (colours, cursor moves), OSC sequences (titles, links), and lone escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes (a character never split), marked when cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: max(0, limit - len(CUT))].decode(errors="ignore") + CUT


def fit_json(text: str, limit: int) -> str:
    """``text`` cut so that its JSON (ASCII, as replies are written: ``é`` takes six bytes) takes at
    most ``limit`` bytes, marked when cut."""
    size = len(json.dumps(text))
    while size > limit and text:
        keep = max(0, len(text.encode()) * limit // size - len(CUT) - 8)
        text = cut(text, keep) if keep else ""
        size = len(json.dumps(text))
    return text


def _value(mime: str, value: object) -> str | None:
    """A bundle entry as run_code's text: a string as is (Jupyter may split text into a list of
    lines), ``application/json`` as its JSON text; anything else is not a value of that type."""
    if mime == "application/json":
        try:
            return json.dumps(value)
        except (ValueError, TypeError, RecursionError):
            return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(value)
    return None


def output(data: object, *, main: bool, budget: int) -> tuple[r.CodeOutput, int]:
    """(one display or execute result as a :class:`CodeOutput`, the bytes it takes). Types not in
    CodeMime, malformed, or past ``budget`` (the results' room left in the reply) go to
    ``omitted``; ``text/plain`` is kept (cut to what is left, if need be)."""
    bundle: Mapping[str, object] = data if isinstance(data, dict) else {}
    kept: dict[r.CodeMime, str] = {}
    omitted: list[str] = []
    used = 0
    # text/plain first, so a large image cannot push it out.
    for mime in sorted(bundle, key=lambda name: name != KEPT_TEXT):
        text = _value(mime, bundle[mime]) if mime in MIME_TYPES else None
        if text is None:
            omitted.append(mime[:MAX_MIME_NAME])
            continue
        if mime == KEPT_TEXT:
            text = fit_json(text, min(MAX_TEXT_PLAIN_BYTES, max(TEXT_RESERVE, budget - used)))
        size = len(json.dumps(text))
        if used + size > budget and mime != KEPT_TEXT:
            omitted.append(mime)
            continue
        kept[mime] = text  # type: ignore[index]  # mime is one of CodeMime's (checked above)
        used += size
    return r.CodeOutput(data=kept, is_main_result=main, omitted=omitted[:MAX_OMITTED]), used


def error(content: Mapping[str, object]) -> r.CodeError:
    """A kernel's ``error`` message (or an ``execute_reply`` with status error) as run_code's error."""
    name, value, lines = content.get("ename"), content.get("evalue"), content.get("traceback")
    traceback = "\n".join(line for line in lines if isinstance(line, str)) if isinstance(lines, list) else ""
    return r.CodeError(
        name=cut(name if isinstance(name, str) else "Error", MAX_ERROR_NAME),
        value=cut(strip_ansi(value) if isinstance(value, str) else "", MAX_ERROR_VALUE),
        traceback=cut(strip_ansi(traceback), MAX_TRACEBACK),
    )
