"""What a recording keeps of the bytes commands and file operations carry: a pure function of an event.

Uploaded bytes (``file_write``'s ``content``/``content_base64``, ``process_write``'s
``data``/``data_base64``, ``exec``'s ``stdin``/``stdin_base64``) are kept only up to a short prefix
(:data:`INPUT_PREFIX_BYTES`); outputs (``exec``'s ``stdout``/``stderr``, ``file_read``'s
``content``, ``process_output``'s ``data``; ``run_code``'s printed logs, each result's formats and its
traceback) share the event's output budget. A ``run_code``'s ``code`` is kept up to
:data:`CODE_PREFIX_BYTES` (a replay runs it again: a cell cut is skipped), and its logs, printed in
chunks whose boundaries are timing, are kept as one chunk per stream. Each such value, cut
or not, gets an entry in the event's ``payloads``, keyed by its dotted path
(``request.action.content``, ``native.0.content``, ``reply.result.stdout``): ``size`` and
``sha256`` of the bytes it stands for (base64 decoded; text as UTF-8) and ``truncated`` when only a
prefix was kept. So a replay can compare a step's output or file by its digest even when the
recording kept only the start of it, and a viewer can say how much there was.

``exec``'s ``env`` is never kept verbatim (it is where secrets go): its names stay, each value
becomes ``{"size", "sha256"}`` of its UTF-8 (:func:`hide`), so a reader sees which variables were
set and can tell whether two runs set the same value, never what it was. An OpenAI
``local_shell_call``'s ``action`` (``type: "exec"``, with ``env``) is hidden the same way.

A person's input (an event of dialect ``human``, actor ``human:<link>``: a viewer holding the lease)
never keeps what was typed (:func:`redact_human`): a ``type`` keeps ``{"type": "type", "redacted":
true, "length": <characters>}``, and a ``key`` that types a character (``a``, ``shift+a``, ``space``,
a digit, AltGr's characters, the keypad's) keeps ``{"type": "key", "redacted": true, "length":
<character presses>}``; key chords that type nothing (Return, Tab, arrows, ``ctrl+a``, shortcuts)
stay as they are. No digest is kept (a short password's sha256 is as good as the password). An
error message that quotes the text is withheld too. The agent's own events are not touched.

Both the controller (before an event enters its buffer) and the gateway (before it is written, with
its own text cap) run it: running it again keeps the first digests and only cuts further.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict, TypeVar

from corral.contracts import actors
from corral.errors import UnknownKeyError
from corral.protocol import keys as keyparse

INPUT_PREFIX_BYTES = 1024  # of each uploaded value (a small file_write stays whole, so it replays)
OUTPUT_BUDGET_BYTES = 48 << 10  # all outputs of one event together (the gateway's text cap is 64 KiB)
PAYLOADS = "payloads"

# Request fields that carry what the agent uploaded, by action type.
INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "file_write": ("content", "content_base64"),
    "process_write": ("data", "data_base64"),
    "exec": ("stdin", "stdin_base64"),
}
# Request fields kept whole up to a larger prefix than an upload's: what a replay must send again.
CODE_FIELDS: dict[str, tuple[str, ...]] = {"run_code": ("code",)}
CODE_PREFIX_BYTES = 16 << 10
IMAGE_MIMES = frozenset({"image/png", "image/jpeg"})  # a run_code result's base64 formats

# Request fields whose values are never kept (names stay; values become their size and sha256).
HIDDEN_FIELDS: dict[str, tuple[str, ...]] = {"exec": ("env",)}
# Result fields that carry what a command printed or a file held, by action type.
OUTPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "exec": ("stdout", "stderr"),
    "file_read": ("content",),
    "process_output": ("data",),
}

HUMAN_DIALECT = "human"  # corral.sandbox.control.viewers.DIALECT: a viewer's input
REDACTED = "redacted"
WITHHELD = "withheld: the message may quote the person's typed text"
# Modifiers that still type a character (shift: capitals; AltGr: a layout's third level).
_CHARACTER_MODIFIERS = frozenset({"Shift_L", "Shift_R", "ISO_Level3_Shift"})

# Where a value sits: (the JSON object or list holding it, its key or index, its dotted path, whether
# it is base64). The holders are the request's and the reply's own objects, each action's fields: open-ended.
Slot = tuple[Any, str | int, str, bool]
Event = TypeVar("Event", bound=Mapping[str, Any])  # an event as the caller holds it, given back the same


class Payload(TypedDict):
    """What an uploaded or output value stood for, whole: its size and sha256."""

    size: int
    sha256: str
    truncated: bool  # only a prefix of it was kept


class Hidden(TypedDict):
    """A value never kept verbatim (an ``env`` value): what it was, not what it said."""

    size: int
    sha256: str


def digest(text: str, is_base64: bool) -> tuple[int, str]:
    """The size and sha256 of the bytes ``text`` stands for (base64 decoded; else UTF-8)."""
    data = _bytes(text, is_base64)
    return len(data), hashlib.sha256(data).hexdigest()


def _bytes(text: str, is_base64: bool) -> bytes:
    if is_base64:
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            pass  # not base64 after all (a refused request): digest the text as sent
    return text.encode("utf-8", "surrogatepass")


def prefix(text: str, limit: int, is_base64: bool) -> str:
    """At most ``limit`` bytes of ``text``: whole characters, and whole base64 quads."""
    if is_base64:
        return text[: max(0, limit) // 4 * 4]
    return text.encode("utf-8", "surrogatepass")[: max(0, limit)].decode("utf-8", "ignore")


def is_hidden(value: Any) -> bool:
    """A value :func:`hide` replaced: ``{"size": int, "sha256": str}`` and nothing else."""
    return (
        isinstance(value, dict)
        and set(value) == {"size", "sha256"}
        and isinstance(value["size"], int)
        and isinstance(value["sha256"], str)
    )


def hide(value: Any) -> Hidden:
    """``{"size", "sha256"}`` of a value (text as UTF-8, anything else as its JSON); a hidden one as it is."""
    if is_hidden(value):
        return {"size": value["size"], "sha256": value["sha256"]}
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    size, sha256 = digest(text, False)
    return {"size": size, "sha256": sha256}


def hide_values(value: Any) -> Any:
    """An ``env``: each name kept with its value hidden; one that is no mapping (refused) hidden whole."""
    if isinstance(value, dict) and not is_hidden(value):
        return {name: hide(item) for name, item in value.items()}
    return hide(value)


def _action_type(value: Any) -> str | None:
    return value.get("type") if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def _inputs(action: Any, path: str, fields: Mapping[str, tuple[str, ...]] = INPUT_FIELDS) -> Iterator[Slot]:
    for key in fields.get(_action_type(action) or "", ()):
        if isinstance(action.get(key), str):
            yield action, key, f"{path}.{key}", key.endswith("_base64")


def _secrets(action: Any) -> Iterator[tuple[Any, str]]:
    """Where ``action`` holds values never kept verbatim (``exec``'s ``env``) not hidden yet."""
    for key in HIDDEN_FIELDS.get(_action_type(action) or "", ()):
        if key in action and action[key] is not None and hide_values(action[key]) != action[key]:
            yield action, key


def _code_logs(result: Any) -> Iterator[tuple[dict[str, Any], str, list[str]]]:
    """A ``run_code`` result's printed chunks, per stream: (the logs object, the stream, its chunks)."""
    logs = result.get("logs") if isinstance(result, dict) else None
    if not isinstance(logs, dict):
        return
    for stream in ("stdout", "stderr"):
        chunks = logs.get(stream)
        if isinstance(chunks, list) and chunks and all(isinstance(chunk, str) for chunk in chunks):
            yield logs, stream, chunks


def _join_code_logs(event: dict[str, Any]) -> None:
    """A ``run_code`` reply's logs as one chunk per stream (in place, on redact's copy): the recording
    keeps what was printed, not how the kernel happened to split it."""
    reply = event.get("reply")
    result = reply.get("result") if isinstance(reply, dict) else None
    for logs, stream, chunks in _code_logs(result):
        logs[stream] = ["".join(chunks)]


def _code_outputs(result: dict[str, Any], path: str) -> Iterator[Slot]:
    """A ``run_code`` result's texts: each log stream's first chunk (the only one, once joined), each
    result's formats (images base64), the traceback."""
    for _, stream, chunks in _code_logs(result):
        yield chunks, 0, f"{path}.logs.{stream}", False
    outputs = result.get("results")
    for index, output in enumerate(outputs if isinstance(outputs, list) else []):
        data = output.get("data") if isinstance(output, dict) else None
        for mime, text in data.items() if isinstance(data, dict) else ():
            if isinstance(text, str):
                yield data, mime, f"{path}.results.{index}.data.{mime}", mime in IMAGE_MIMES
    error = result.get("error")
    if isinstance(error, dict) and isinstance(error.get("traceback"), str):
        yield error, "traceback", f"{path}.error.traceback", False


def _outputs(result: Any, kind: str | None, path: str) -> Iterator[Slot]:
    if not isinstance(result, dict):
        return
    if kind in CODE_FIELDS:
        yield from _code_outputs(result, path)
        return
    is_base64 = result.get("encoding") == "base64"
    for key in OUTPUT_FIELDS.get(kind or "", ()):
        if isinstance(result.get(key), str):
            yield result, key, f"{path}.{key}", is_base64


def _shares(sizes: list[int], budget: int) -> list[int]:
    """The budget split so short values stay whole and long ones share the rest evenly."""
    shares = [0] * len(sizes)
    left = budget
    for rank, index in enumerate(sorted(range(len(sizes)), key=lambda i: sizes[i])):
        shares[index] = min(sizes[index], left // (len(sizes) - rank))
        left -= shares[index]
    return shares


def _keep(slot: Slot, limit: int, payloads: dict[str, Payload]) -> None:
    holder, key, path, is_base64 = slot
    text: str = holder[key]
    entry = payloads.get(path)
    if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)):  # a second pass keeps the first
        size, sha256 = digest(text, is_base64)
        entry = {"size": size, "sha256": sha256, "truncated": False}
    kept = prefix(text, limit, is_base64)
    if kept != text:
        holder[key], entry = kept, {**entry, "truncated": True}
    payloads[path] = entry


def vendor_exec(request: Any) -> Any:
    """A vendor request's own exec: an OpenAI ``local_shell_call``'s ``action`` (``type: "exec"``, ``env``)."""
    item = request.get("openai") if isinstance(request, dict) else None
    return item.get("action") if isinstance(item, dict) and item.get("type") == "local_shell_call" else None


def _actions(event: Mapping[str, Any]) -> list[Any]:
    """The request's action (or a vendor request's exec) and each native one."""
    request, native = event.get("request"), event.get("native")
    action = request.get("action") if isinstance(request, dict) else None
    return [action, vendor_exec(request), *(native if isinstance(native, list) else [])]


def _slots(event: Mapping[str, Any]) -> tuple[list[Slot], list[Slot], list[Slot]]:
    """Where the event holds uploaded bytes and code (request and native actions) and outputs (the result)."""
    request, native, reply = event.get("request"), event.get("native"), event.get("reply")
    action = request.get("action") if isinstance(request, dict) else None
    actions = native if isinstance(native, list) else []
    inputs = list(_inputs(action, "request.action"))
    for index, step in enumerate(actions):
        inputs += _inputs(step, f"native.{index}")
    code = list(_inputs(action, "request.action", CODE_FIELDS))
    for index, step in enumerate(actions):
        code += _inputs(step, f"native.{index}", CODE_FIELDS)
    # A native reply's result is its last step's (a request that was not planned has no result).
    kind = _action_type(actions[-1] if actions else action)
    result = reply.get("result") if isinstance(reply, dict) else None
    return inputs, code, list(_outputs(result, kind, "reply.result"))


def is_character_keysym(keysym: int) -> bool:
    """Whether pressing ``keysym`` types a character: Latin-1 and the legacy character sets, dead
    keys (they compose one), the keypad's characters, Unicode keysyms. Function keys, cursor keys,
    Return, Tab, BackSpace, Escape, modifiers and XF86 keys type none."""
    if 0x20 <= keysym <= 0x7E or 0xA0 <= keysym <= 0xFDFF:
        return True
    if 0xFE50 <= keysym <= 0xFE93:  # dead_grave ... dead_greek
        return True
    if keysym == 0xFF80 or 0xFFAA <= keysym <= 0xFFB9 or keysym == 0xFFBD:  # KP_Space, KP_* and KP_0-9, KP_Equal
        return True
    return 0x01000020 <= keysym <= 0x0110FFFF


def types_character(combo: keyparse.KeyCombo) -> bool:
    """Whether a combo types a character: one character key, with no modifier but shift or AltGr."""
    plain = [key for key in combo.keys if not key.is_modifier]
    modifiers = {key.name for key in combo.keys if key.is_modifier}
    return len(plain) == 1 and modifiers <= _CHARACTER_MODIFIERS and is_character_keysym(plain[0].keysym)


def typed_presses(keys: str) -> int | None:
    """How many combos of an xdotool key sequence type a character (0: only chords and named keys);
    None when it cannot be read (then it is treated as all typed text)."""
    try:
        return sum(1 for combo in keyparse.parse_sequence(keys) if types_character(combo))
    except (UnknownKeyError, ValueError):
        return None


def is_human(event: Mapping[str, Any]) -> bool:
    """A person's input through a viewer (never the agent's, whose dialects are native and the vendors')."""
    actor = event.get("actor")
    return event.get("dialect") == HUMAN_DIALECT or (isinstance(actor, str) and actors.is_human(actor))


def _typed(action: Any) -> str | None:
    """The text a person's action typed (a ``type``'s text, a ``key``'s sequence that types), if any."""
    kind = _action_type(action)
    if kind == "type" and isinstance(action.get("text"), str):
        text: str = action["text"]
        return text
    if kind == "key" and isinstance(action.get("keys"), str) and typed_presses(action["keys"]) != 0:
        keys: str = action["keys"]
        return keys
    return None


def _redacted_action(action: dict[str, Any]) -> dict[str, Any]:  # a native action's JSON, its own fields
    """``action`` without what it typed: its length and the mark instead."""
    if _action_type(action) == "type":
        kept = {k: v for k, v in action.items() if k != "text"}
        return {**kept, REDACTED: True, "length": len(action["text"])}
    presses = typed_presses(action["keys"])
    kept = {k: v for k, v in action.items() if k != "keys"}
    return {**kept, REDACTED: True, "length": len(action["keys"].split()) if presses is None else presses}


def _withhold_quoting(error: Any, typed: list[str]) -> None:
    """An error message that quotes typed text (4 characters or more: shorter ones match anything)."""
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str) and any(len(text) >= 4 and text in message for text in typed):
        error["message"] = WITHHELD


def redact_human(event: Event) -> Event:
    """A person's input event with what was typed left out (its length and ``redacted`` kept): in
    its request, its native actions, and any error message quoting it. Any other event, and one
    already redacted, comes back as it is."""
    if not is_human(event):
        return event
    request, native = event.get("request"), event.get("native")
    holders: list[tuple[Any, Any]] = []
    if isinstance(request, dict):
        holders.append((request, "action"))
    if isinstance(native, list):
        holders += [(native, index) for index in range(len(native))]
    typed = [text for holder, key in holders if (text := _typed(holder[key])) is not None]
    if not typed:
        return event
    out = _copy(event)
    for holder, key in holders:
        container = out["request"] if holder is request else out["native"]
        if _typed(container[key]) is not None:
            container[key] = _redacted_action(container[key])
    reply = out.get("reply")
    _withhold_quoting(out.get("error"), typed)
    _withhold_quoting(reply.get("error") if isinstance(reply, dict) else None, typed)
    redacted: Event = out
    return redacted


def redacted_length(event: Mapping[str, Any]) -> int | None:
    """The characters a person typed in a redacted event (None: nothing of it was redacted)."""
    native = event.get("native")
    steps = native if isinstance(native, list) else []
    lengths = [step.get("length") for step in steps if isinstance(step, dict) and step.get(REDACTED) is True]
    if not lengths:
        return None
    return sum(length for length in lengths if isinstance(length, int))


def redact(event: Event, output_budget: int = OUTPUT_BUDGET_BYTES) -> Event:
    """``event`` (a recorded action: ``request``, ``native``, ``reply``) with uploaded bytes cut to
    a prefix, outputs cut to ``output_budget`` bytes in all, and ``payloads`` saying what they were;
    ``env`` values hidden (names kept).
    A person's typed text is left out (:func:`redact_human`).
    The event given is left as it was; one with nothing of the kind comes back as it is."""
    event = redact_human(event)
    if not any(_slots(event)) and not any(True for action in _actions(event) for _ in _secrets(action)):
        return event
    out = _copy(event)
    _join_code_logs(out)
    for action in _actions(out):
        for holder, key in list(_secrets(action)):
            holder[key] = hide_values(holder[key])
    inputs, code, outputs = _slots(out)
    known = out.get(PAYLOADS)
    payloads: dict[str, Payload] = dict(known) if isinstance(known, dict) else {}
    for slot in inputs:
        _keep(slot, INPUT_PREFIX_BYTES, payloads)
    for slot in code:
        _keep(slot, CODE_PREFIX_BYTES, payloads)
    sizes = [len(holder[key].encode("utf-8", "surrogatepass")) for holder, key, _, _ in outputs]
    for slot, share in zip(outputs, _shares(sizes, output_budget), strict=True):
        _keep(slot, share, payloads)
    if payloads or PAYLOADS in out:
        out[PAYLOADS] = payloads
    redacted: Event = out
    return redacted


def _copy(value: Any) -> Any:
    """A copy of the JSON structure (the strings shared: they are immutable)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
