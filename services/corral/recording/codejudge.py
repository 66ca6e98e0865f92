"""A replayed ``run_code`` step judged by its outputs (pure): the same error (by name) or none, the
same number of results, each result's text formats by their text (memory addresses such as
``<Line2D at 0x7f...>`` aside, which differ on every run) and its images by how far they differ to
the eye (:func:`corral.recording.imagediff.similarity`), and the printed logs when the step asks
(``expect: {"stdout": "exact"}``, as an exec's).

Where the recording kept only the start of a value (its ``payloads`` entry is ``truncated``), the
value is compared by its sha256 instead: an image by its bytes, a text as printed.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from corral.recording.imagediff import similarity
from corral.recording.redact import IMAGE_MIMES, PAYLOADS, digest

# The share of an image's pixels that may differ visibly (a chart drawn again is usually identical).
IMAGE_THRESHOLD = 0.01
TEXT_MIMES = ("text/plain", "text/html", "text/markdown", "application/json")  # SVG carries its render date
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,16}\b")


def _result(reply: Any) -> dict[str, Any]:
    result = reply.get("result") if isinstance(reply, Mapping) else None
    return result if isinstance(result, dict) else {}


def _described(size: int, sha256: str) -> str:
    return f"{size} bytes, sha256 {sha256[:12]}…"


def normalised(text: str) -> str:
    """``text`` with memory addresses made one (``0x7f3a...`` -> ``0x…``)."""
    return _ADDRESS.sub("0x…", text)


def _payload(event: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    payloads = event.get(PAYLOADS)
    entry = payloads.get(path) if isinstance(payloads, dict) else None
    ok = isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("size"), int)
    return entry if ok else None


def _whole(event: Mapping[str, Any], path: str) -> bool:
    """Whether the recording kept the value at ``path`` whole (redaction did not cut it, nor the gateway's clip)."""
    entry = _payload(event, path)
    clipped = isinstance(event.get("truncated"), dict) and "reply" in event["truncated"]
    return not clipped and not (entry is not None and entry.get("truncated"))


def _by_digest(
    name: str, event: Mapping[str, Any], path: str, mine: str, is_base64: bool
) -> list[tuple[str, str, str, bool]]:
    entry = _payload(event, path)
    if entry is None:
        return []  # cut by the gateway's clip, with no digest: nothing whole to compare
    size, sha256 = digest(mine, is_base64)
    theirs = _described(int(entry["size"]), str(entry["sha256"]))
    return [(name, theirs, _described(size, sha256), entry["sha256"] == sha256)]


def _image(name: str, recorded: str, replayed: str) -> tuple[str, str, str, bool]:
    try:
        score = similarity(base64.b64decode(recorded, validate=True), base64.b64decode(replayed, validate=True))
    except (binascii.Error, ValueError, OSError) as exc:  # not base64, not an image, too large
        return name, "an image", f"not comparable: {exc}", False
    return name, f"differs by at most {IMAGE_THRESHOLD:.0%}", f"{score:.2%} differs", score <= IMAGE_THRESHOLD


def _data(output: Any) -> dict[str, Any]:
    data = output.get("data") if isinstance(output, Mapping) else None
    return data if isinstance(data, dict) else {}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _output_checks(event: Mapping[str, Any], index: int, mine: Mapping[str, Any]) -> list[tuple[str, str, str, bool]]:
    recorded_outputs = _result(event.get("reply")).get("results")
    theirs = recorded_outputs[index] if isinstance(recorded_outputs, list) else {}
    their_data = theirs.get("data") if isinstance(theirs, dict) else None
    my_data = mine.get("data") if isinstance(mine, dict) else None
    their_data, my_data = (
        their_data if isinstance(their_data, dict) else {},
        my_data if isinstance(my_data, dict) else {},
    )
    checks: list[tuple[str, str, str, bool]] = []
    for mime in (*TEXT_MIMES, *sorted(IMAGE_MIMES)):
        recorded, replayed = their_data.get(mime), my_data.get(mime)
        if not isinstance(recorded, str):
            continue
        name, path = f"result {index + 1} {mime}", f"reply.result.results.{index}.data.{mime}"
        if not isinstance(replayed, str):
            checks.append((name, "present", "missing", False))
        elif not _whole(event, path):
            checks += _by_digest(name, event, path, replayed, mime in IMAGE_MIMES)
        elif mime in IMAGE_MIMES:
            checks.append(_image(name, recorded, replayed))
        else:
            same = normalised(recorded) == normalised(replayed)
            checks.append((name, _shown(recorded), _shown(replayed), same))
    return checks


def _shown(text: str) -> str:
    one_line = " ".join(text.split())
    return repr(one_line if len(one_line) <= 60 else one_line[:59] + "…")


def _error_name(result: Mapping[str, Any]) -> str:
    error = result.get("error")
    return str(error.get("name")) if isinstance(error, dict) else "none"


def _log_checks(
    event: Mapping[str, Any], mine: Mapping[str, Any], expect: Mapping[str, str]
) -> list[tuple[str, str, str, bool]]:
    checks: list[tuple[str, str, str, bool]] = []
    logs = mine.get("logs")
    for stream in ("stdout", "stderr"):
        if expect.get(stream) != "exact":
            continue
        chunks = logs.get(stream) if isinstance(logs, dict) else None
        printed = "".join(c for c in chunks if isinstance(c, str)) if isinstance(chunks, list) else ""
        recorded = _result(event.get("reply")).get("logs")
        their_chunks = recorded.get(stream) if isinstance(recorded, dict) else None
        path = f"reply.result.logs.{stream}"
        if _payload(event, path) is not None:
            checks += _by_digest(stream, event, path, printed, False)
        elif isinstance(their_chunks, list) and not their_chunks:  # nothing printed when recorded
            checks.append((stream, "nothing", _shown(printed) if printed else "nothing", not printed))
    return checks


def code_checks(
    event: Mapping[str, Any], reply: Mapping[str, Any], expect: Mapping[str, str]
) -> list[tuple[str, str, str, bool]]:
    """Each compared value of a ``run_code`` step that succeeded both times: (name, recorded, replayed, passed)."""
    recorded, mine = _result(event.get("reply")), _result(reply)
    checks = [("error", _error_name(recorded), _error_name(mine), _error_name(recorded) == _error_name(mine))]
    if recorded.get("timed_out") or mine.get("timed_out"):
        timed = str(bool(recorded.get("timed_out"))), str(bool(mine.get("timed_out")))
        checks.append(("timed out", timed[0], timed[1], timed[0] == timed[1]))
    theirs, ours = _listed(recorded.get("results")), _listed(mine.get("results"))
    checks.append(("results", str(len(theirs)), str(len(ours)), len(theirs) == len(ours)))
    for index, output in enumerate(ours[: len(theirs)]):
        checks += _output_checks(event, index, output)
    return checks + _log_checks(event, mine, expect)
