"""One cell's messages folded into run_code's answer: only this cell's, bounded, streamed as events."""

from __future__ import annotations

import json

from corral.protocol import results as r
from corral.sandbox.kernels import collect
from corral.sandbox.kernels.collect import Cell

from .fakes import CELL, finished, msg


def test_a_cells_messages_make_its_answer() -> None:
    cell = Cell(CELL, max_output_bytes=1000)
    events = []
    for message in [
        msg("status", execution_state="busy"),
        msg("execute_input", code="x", execution_count=3),
        msg("stream", name="stdout", text="hi\n"),
        msg("stream", name="stderr", text="warn\n"),
        msg("display_data", data={"text/plain": "shown"}),
        msg("execute_result", data={"text/plain": "42"}, execution_count=3),
        *finished(3),
    ]:
        events += cell.take(message)
    assert cell.done and cell.execution_count == 3 and cell.error is None
    assert cell.logs() == r.CodeLogs(stdout=["hi\n"], stderr=["warn\n"], truncated=False)
    assert [(o.data, o.is_main_result) for o in cell.results] == [
        ({"text/plain": "shown"}, False),
        ({"text/plain": "42"}, True),
    ]
    assert [type(e).__name__ for e in events] == ["OutputEvent", "OutputEvent", "CodeResultEvent", "CodeResultEvent"]
    assert isinstance(events[1], r.OutputEvent) and (events[1].stream, events[1].data) == ("stderr", "warn\n")


def test_another_requests_messages_are_ignored() -> None:
    cell = Cell(CELL, max_output_bytes=1000)
    assert cell.take(msg("stream", parent="other", name="stdout", text="x")) == []
    cell.take(msg("status", parent="other", execution_state="idle"))
    cell.take(msg("status", parent=None, execution_state="idle"))
    assert cell.stdout == [] and not cell.idle


def test_done_needs_both_the_reply_and_idle() -> None:
    cell = Cell(CELL, max_output_bytes=10)
    reply, idle = finished()
    cell.take(idle)
    assert not cell.done
    cell.take(reply)
    assert cell.done


def test_logs_stop_at_max_output_bytes_without_splitting_a_character() -> None:
    cell = Cell(CELL, max_output_bytes=10)
    events = cell.take(msg("stream", name="stdout", text="abcdefgh"))
    events += cell.take(msg("stream", name="stdout", text="é€xyz"))
    events += cell.take(msg("stream", name="stderr", text="more"))
    assert cell.stdout == ["abcdefgh", "é"] and cell.stderr == [] and cell.truncated
    assert cell.log_bytes <= 10 and len(events) == 2


def test_logs_json_is_bounded_however_small_the_chunks(monkeypatch: object) -> None:
    cell = Cell(CELL, max_output_bytes=1 << 30)
    cell.log_json = collect.LOGS_JSON_BYTES - 10
    cell.take(msg("stream", name="stdout", text="\x01" * 5))  # 30 bytes of JSON: over
    assert cell.stdout == [] and cell.truncated


def test_a_stream_of_the_wrong_shape_is_ignored() -> None:
    cell = Cell(CELL, max_output_bytes=100)
    for content in [{"name": "stdin", "text": "x"}, {"name": "stdout", "text": 5}, {"name": "stdout", "text": ""}]:
        assert cell.take(msg("stream", **content)) == []
    assert cell.stdout == [] and not cell.truncated


def test_results_together_stay_within_their_budget() -> None:
    cell = Cell(CELL, max_output_bytes=100)
    image = "A" * (2 << 20)
    for _ in range(5):
        cell.take(msg("display_data", data={"text/plain": "<Figure>", "image/png": image}))
    kept = [o for o in cell.results if "image/png" in o.data]
    assert len(kept) == 2 and all(o.omitted == ["image/png"] for o in cell.results[2:])
    assert all(o.data["text/plain"] == "<Figure>" for o in cell.results)
    size = len(json.dumps([o.wire() for o in cell.results]))
    assert size <= collect.RESULTS_BYTES


def test_the_number_of_results_is_bounded() -> None:
    cell = Cell(CELL, max_output_bytes=100)
    for _ in range(collect.MAX_RESULTS + 5):
        cell.take(msg("display_data", data={"text/plain": "x"}))
    assert len(cell.results) == collect.MAX_RESULTS


def test_an_error_message_and_an_error_reply() -> None:
    cell = Cell(CELL, max_output_bytes=100)
    cell.take(msg("error", ename="NameError", evalue="name 'y' is not defined", traceback=["\x1b[31mNameError\x1b[0m"]))
    cell.take(msg("execute_reply", status="error", ename="Other", evalue="", traceback=[], execution_count=2))
    assert cell.error == r.CodeError(name="NameError", value="name 'y' is not defined", traceback="NameError")
    only_reply = Cell(CELL, max_output_bytes=100)
    only_reply.take(
        msg("execute_reply", status="error", ename="Aborted", evalue="", traceback=[], execution_count=True)
    )
    assert only_reply.error is not None and only_reply.error.name == "Aborted" and only_reply.execution_count is None
