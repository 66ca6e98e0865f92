"""The dispatcher and the control lease, over a stand-in desktop: while a human holds the lease every
agent request but ``control``/``request_control`` is refused before anything runs (commands and files
too), or waits for it with ``wait_for_control_ms``; a hand-back reaches the agent once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from corral.protocol import Limits
from corral.sandbox.control.lease import ControlLease
from corral.sandbox.dispatch import Dispatcher

from .desktop_fake import Parts, fake_desktop, settled
from .test_dispatch import Recorder, Reporter

HUMAN = "human:lnk_3kq9x0a1b2c4"
TAKEN_AT = 100.0


class WatchedLease(ControlLease):
    """The real lease on a fixed clock, saying when the agent asked it (and how long it would wait)."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: TAKEN_AT)
        self.asked = asyncio.Event()
        self.waits: list[int] = []

    async def agent_may_act(self, wait_ms: int = 0) -> None:
        self.waits.append(wait_ms)
        self.asked.set()
        await super().agent_may_act(wait_ms)


def _dispatcher() -> tuple[Dispatcher, WatchedLease, Parts, Reporter, Recorder]:
    parts, reporter, recorder = Parts(), Reporter(), Recorder()
    desktop = fake_desktop(parts)
    lease = desktop.lease = WatchedLease()
    return Dispatcher(desktop, Limits(), reporter, recorder), lease, parts, reporter, recorder  # type: ignore[arg-type]


async def _send(dispatcher: Dispatcher, message: dict[str, Any]) -> dict[str, Any]:
    return await dispatcher.handle(json.dumps(message))


CLICK = {"id": 1, "action": {"type": "click", "x": 10, "y": 20}}


async def test_while_a_human_holds_the_lease_an_action_is_refused_before_it_runs() -> None:
    dispatcher, lease, parts, reporter, recorder = _dispatcher()
    lease.take(HUMAN)
    reply = await _send(dispatcher, CLICK)
    assert reply == {
        "ok": False,
        "id": 1,
        "error": {
            "code": "control_taken",
            "message": f"control of the session is held by {HUMAN}; wait for it to be handed back",
            "holder": HUMAN,
            "since": TAKEN_AT,
        },
    }
    assert parts.calls == [] and reporter.seen == []  # nothing ran, the proxy heard of no action
    assert lease.waits == [0]
    [event] = recorder.events
    assert event["error"]["code"] == "control_taken" and event["native"][0]["type"] == "click"


async def test_commands_files_and_the_shell_are_refused_alike() -> None:
    dispatcher, lease, parts, _, _ = _dispatcher()
    lease.take(HUMAN)
    for action in (
        {"type": "exec", "command": "xdotool click 1"},
        {"type": "file_write", "path": "/workspace/x", "content": "x"},
        {"type": "shell", "command": "pwd"},
        {"type": "secrets"},
    ):
        reply = await _send(dispatcher, {"id": action["type"], "action": action})
        assert (reply["ok"], reply["error"]["code"], reply["error"]["holder"]) == (False, "control_taken", HUMAN)
    assert parts.calls == []


async def test_an_action_that_may_wait_runs_once_the_lease_is_handed_back_and_carries_the_note_once() -> None:
    dispatcher, lease, parts, reporter, _ = _dispatcher()
    lease.take(HUMAN)
    waiting = asyncio.create_task(_send(dispatcher, {**CLICK, "wait_for_control_ms": 60_000}))
    await lease.asked.wait()
    assert parts.calls == []  # still waiting: nothing ran
    lease.release(HUMAN, "logged in")
    reply = await waiting
    assert reply["ok"] is True and lease.waits == [60_000]
    assert reply["control"] == {"by": HUMAN, "note": "logged in", "at": TAKEN_AT, "left": False}
    assert parts.methods("input") and reporter.seen[0][0] == "started"
    again = await _send(dispatcher, CLICK)
    assert again["ok"] is True and "control" not in again  # once


async def test_a_wait_that_runs_out_is_refused_with_the_holder() -> None:
    dispatcher, lease, parts, _, _ = _dispatcher()
    lease.take(HUMAN)
    reply = await _send(dispatcher, {**CLICK, "wait_for_control_ms": 1})
    assert reply["error"]["code"] == "control_taken" and reply["error"]["since"] == TAKEN_AT
    assert parts.calls == []


async def test_a_failed_reply_carries_the_hand_back_too() -> None:
    dispatcher, lease, _, _, _ = _dispatcher()
    lease.take(HUMAN)
    lease.release(HUMAN, None)
    reply = await _send(dispatcher, {"id": 2, "action": {"type": "click", "x": 99_999, "y": 1}})
    assert reply["ok"] is False and reply["error"]["code"] == "out_of_bounds"
    assert reply["control"] == {"by": HUMAN, "note": None, "at": TAKEN_AT, "left": False}


async def test_control_is_never_refused_and_returns_the_hand_back_in_its_result_instead() -> None:
    dispatcher, lease, _, _, _ = _dispatcher()
    lease.take(HUMAN)
    held = await _send(dispatcher, {"id": 3, "action": {"type": "control"}})
    assert held["ok"] is True and "control" not in held
    assert held["result"] == {"holder": HUMAN, "since": TAKEN_AT, "help": None, "handed_back": None}
    waiting = asyncio.create_task(_send(dispatcher, {"id": 4, "action": {"type": "control", "wait_ms": 60_000}}))
    # One turn of the loop: the task runs until it waits on the lease (agent_may_act is not asked).
    await asyncio.sleep(0)
    assert not waiting.done()
    lease.release(HUMAN, "done")
    back = await waiting
    assert back["result"]["holder"] == "agent"
    assert back["result"]["handed_back"] == {"by": HUMAN, "note": "done", "at": TAKEN_AT, "left": False}
    assert "control" not in back and lease.waits == []
    after = await _send(dispatcher, CLICK)
    assert after["ok"] is True and "control" not in after  # consumed by control


async def test_a_vendor_call_refused_by_the_lease_gets_the_vendors_error_form() -> None:
    dispatcher, lease, parts, _, _ = _dispatcher()
    lease.take(HUMAN)
    block = {"type": "tool_use", "id": "toolu_7", "name": "bash", "input": {"command": "ls"}}
    reply = await _send(dispatcher, {"id": 5, "anthropic": block})
    assert reply["ok"] is False and reply["error"]["code"] == "control_taken" and reply["error"]["holder"] == HUMAN
    result = reply["result"]["tool_result"]
    assert result["tool_use_id"] == "toolu_7" and result["is_error"] is True
    assert HUMAN in result["content"][0]["text"]
    item = {"type": "computer_call", "call_id": "call_1", "action": {"type": "click", "x": 1, "y": 1}}
    computer = await _send(dispatcher, {"id": 6, "openai": item})
    assert computer["ok"] is False and computer["error"]["code"] == "control_taken"
    assert computer["result"]["item"]["type"] == "computer_call_output"
    assert parts.methods("input") == [] and parts.methods("processes") == []


async def _queued_on_the_lock(dispatcher: Dispatcher, message: dict[str, Any]) -> asyncio.Task[dict[str, Any]]:
    """``message`` sent while the test holds the desktop's lock, once it waits for that lock."""
    desktop = dispatcher.desktop
    task = asyncio.create_task(_send(dispatcher, message))
    await settled(lambda: bool(desktop.lock.waiting))  # past the lease's check, queued on the lock
    return task


async def test_a_human_who_takes_the_lease_while_an_action_waits_for_the_lock_stops_it() -> None:
    dispatcher, lease, parts, reporter, _ = _dispatcher()
    desktop = dispatcher.desktop
    async with desktop.lock:  # an earlier action still running
        waiting = await _queued_on_the_lock(dispatcher, CLICK)
        lease.take(HUMAN)
    reply = await asyncio.wait_for(waiting, 5)
    assert (reply["ok"], reply["error"]["code"], reply["error"]["holder"]) == (False, "control_taken", HUMAN)
    assert not parts.methods("input") and reporter.seen == []


async def test_a_commands_screenshot_is_not_taken_once_a_human_holds_the_lease() -> None:
    dispatcher, lease, parts, _, _ = _dispatcher()
    desktop = dispatcher.desktop
    async with desktop.lock:
        waiting = await _queued_on_the_lock(
            dispatcher, {"id": 2, "action": {"type": "exec", "command": "true"}, "screenshot": True}
        )
        lease.take(HUMAN)
    reply = await asyncio.wait_for(waiting, 5)
    assert (reply["ok"], reply["error"]["code"]) == (False, "control_taken")
    assert parts.methods("processes") == ["exec"] and not parts.methods("screen")


async def test_an_action_after_a_hand_back_runs_once_the_turn_is_over() -> None:
    # The freezer's end of a person's turn (the selections emptied, the agent thawed) comes after the
    # lease is the agent's again: the agent's action waits for it, whichever transport it came by.
    parts, reporter, recorder = Parts(), Reporter(), Recorder()
    desktop = fake_desktop(parts)
    over, asked = asyncio.Event(), asyncio.Event()

    async def turn_over() -> None:
        asked.set()
        await over.wait()

    dispatcher = Dispatcher(desktop, Limits(), reporter, recorder, turn_over=turn_over)  # type: ignore[arg-type]
    waiting = asyncio.create_task(_send(dispatcher, CLICK))
    await asked.wait()
    assert parts.calls == [] and reporter.seen == []  # nothing ran yet
    over.set()
    assert (await waiting)["ok"] is True and parts.methods("input")
    # Refused by the lease: no wait for a turn's end that is not the agent's.
    desktop.lease.take(HUMAN)
    asked.clear()
    assert (await _send(dispatcher, CLICK))["error"]["code"] == "control_taken" and not asked.is_set()
