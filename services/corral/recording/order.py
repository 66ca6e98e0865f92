"""The order a replay sends recorded steps in, and which of them ran beside later ones.

A recording's events are numbered as their requests *end* (the gateway reads them in that order),
but commands and file actions run beside other requests: a ``process_kill`` sent while its
``exec`` runs ends first and is recorded first. A replay sends steps in the order their requests
*came in*: ``request_seq`` (the controller's count of requests as they arrived; it starts again
with a restarted controller, so each run of one controller is ordered on its own), else, in older
bundles, the recorded ``started`` time. A step still running when a later one came in
(:func:`overlaps`) is sent by the replay without waiting for its reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import Any

from corral.recording.bundle import RecordedEvent


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _float(value: Any) -> float | None:
    return float(value) if _number(value) else None


def in_start_order(actions: list[RecordedEvent]) -> list[RecordedEvent]:
    """``actions`` (action events as recorded) in the order their requests came in; events of one
    controller run are ordered among themselves only (a stable sort: ties keep the recorded order)."""
    ordered: list[RecordedEvent] = []
    for _, run in groupby(actions, key=lambda event: event.get("controller_boot")):
        events = list(run)
        if all(_number(event.get("request_seq")) for event in events):
            events.sort(key=lambda event: float(event["request_seq"]))
        elif all(_number(event.get("started")) for event in events):
            events.sort(key=lambda event: float(event["started"]))
        ordered += events
    return ordered


def ended_at(event: Mapping[str, Any]) -> float | None:
    """When the recorded request ended (unix s), if the event says when it started and how long it took."""
    started, elapsed = _float(event.get("started")), _float(event.get("elapsed_ms"))
    return None if started is None or elapsed is None else started + elapsed / 1000


def overlaps(event: Mapping[str, Any], later: Mapping[str, Any]) -> bool:
    """Whether ``event`` was still running when ``later`` came in."""
    end, start = ended_at(event), _float(later.get("started"))
    return end is not None and start is not None and end > start
