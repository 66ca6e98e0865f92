"""The order a replay sends recorded steps in: as their requests came in, not as they ended."""

from __future__ import annotations

from typing import Any

from corral.recording.order import in_start_order, overlaps


def _event(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "event": "action", **fields}


def test_steps_go_in_the_order_their_requests_came_in_each_controller_run_on_its_own() -> None:
    events = [
        _event(1, request_seq=3, controller_boot="a"),  # a process_kill, ended first
        _event(2, request_seq=2, controller_boot="a"),  # the exec it killed
        _event(3, request_seq=1, controller_boot="a"),
        _event(4, request_seq=2, controller_boot="b"),  # a restarted controller counts from 1 again
        _event(5, request_seq=1, controller_boot="b"),
    ]
    assert [e["seq"] for e in in_start_order(events)] == [3, 2, 1, 5, 4]


def test_an_older_bundle_goes_by_when_its_requests_started_else_as_recorded() -> None:
    older = [_event(1, started=10.5), _event(2, started=10.0), _event(3, started=10.5)]
    assert [e["seq"] for e in in_start_order(older)] == [2, 1, 3]  # a tie keeps the recorded order
    unknown = [_event(1), _event(2, started=1.0)]
    assert [e["seq"] for e in in_start_order(unknown)] == [1, 2]


def test_a_step_overlaps_a_later_one_when_it_was_still_running_as_that_came_in() -> None:
    exec_ = _event(2, started=100.0, elapsed_ms=2000.0)
    assert overlaps(exec_, _event(1, started=101.0))
    assert not overlaps(exec_, _event(3, started=102.5))
    assert not overlaps(_event(4), _event(5, started=1.0))  # no timing recorded: never sent beside
