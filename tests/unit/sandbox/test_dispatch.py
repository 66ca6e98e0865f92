"""The dispatcher over a stand-in desktop: one reply per message whatever was sent, the proxy told
when each action starts and ends, and what the recording keeps of each request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from corral.protocol import Limits
from corral.protocol import results as r
from corral.sandbox.dispatch import Dispatcher
from corral.sandbox.tools.files import AgentFiles

from .desktop_fake import STARTED, FakeBrowser, Parts, fake_desktop
from .fakefs import FakeAgentFs


class Reporter:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def started(self, action_id: str) -> None:
        self.seen.append(("started", action_id))

    async def ended(self, action_id: str) -> None:
        self.seen.append(("ended", action_id))


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.before = 0
        self.count = 0

    def arrived(self) -> int:
        self.count += 1
        return self.count

    async def before_action(self) -> None:
        self.before += 1

    def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def _dispatcher(browser: type[FakeBrowser] = FakeBrowser) -> tuple[Dispatcher, Reporter, Recorder]:
    reporter, recorder = Reporter(), Recorder()
    desktop = fake_desktop(Parts(), browser)
    return Dispatcher(desktop, Limits(), reporter, recorder), reporter, recorder  # type: ignore[arg-type]


async def test_a_native_action_is_answered_reported_and_recorded() -> None:
    dispatcher, reporter, recorder = _dispatcher()
    message = {"id": "r1", "action": {"type": "navigate", "url": "https://page.test/"}}
    reply = await dispatcher.handle(json.dumps(message))
    assert reply["ok"] is True and reply["id"] == "r1"
    assert reply["result"] == {"url": "https://page.test/", "title": "after navigate", "status": 200}
    action_id = reply["action_id"]
    assert reporter.seen == [("started", action_id), ("ended", action_id)]
    [event] = recorder.events
    assert recorder.before == 1
    assert {k: event[k] for k in ("action_id", "dialect", "request", "ok", "url", "title", "error", "reply")} == {
        "action_id": action_id,
        "dialect": "action",
        "request": message,
        "ok": True,
        "url": "https://page.test/",
        "title": "after navigate",
        "error": None,
        "reply": reply,
    }
    assert event["native"] == [
        {"type": "navigate", "url": "https://page.test/", "wait_until": "load", "timeout_ms": 30000}
    ]
    assert event["elapsed_ms"] >= 0 and event["started"] > 0


async def test_action_ids_are_unique_and_the_title_is_kept_only_when_an_action_said_it() -> None:
    dispatcher, _, recorder = _dispatcher()
    first = await dispatcher.handle('{"id": 1, "action": {"type": "move", "x": 1, "y": 2}}')
    second = await dispatcher.handle('{"id": 2, "anthropic": {"action": "cursor_position"}}')
    assert first["action_id"] != second["action_id"]
    assert [e["title"] for e in recorder.events] == [None, None]
    assert [e["dialect"] for e in recorder.events] == ["action", "anthropic"]


@pytest.mark.parametrize(
    ("raw", "code", "as_read"),
    [
        ("{nope", "invalid_json", "{nope"),
        (b'{"id": 3, "action": {"type": "teleport"}}', "unknown_action", {"id": 3, "action": {"type": "teleport"}}),
        ('{"id": 4, "action": {"type": "click", "x": 5000, "y": 1}}', "out_of_bounds", None),
    ],
)
async def test_a_refused_message_is_a_failure_reply_and_recorded_as_sent(
    raw: str | bytes, code: str, as_read: Any
) -> None:
    dispatcher, reporter, recorder = _dispatcher()
    reply = await dispatcher.handle(raw)
    assert reply["ok"] is False and reply["error"]["code"] == code
    assert reporter.seen == []  # nothing ran, so the proxy heard of nothing
    [event] = recorder.events
    assert event["action_id"] is None and event["native"] is None and event["ok"] is False
    assert event["error"] == reply["error"]
    assert event["request"] == (as_read if as_read is not None else json.loads(raw))


async def test_an_unexpected_error_is_an_internal_failure_and_the_proxy_hears_the_end() -> None:
    class Broken(FakeBrowser):
        async def info(self) -> dict[str, Any]:
            raise RuntimeError("the fake browser broke")

    dispatcher, reporter, recorder = _dispatcher(Broken)
    reply = await dispatcher.handle('{"id": 5, "action": {"type": "page_info"}}')
    assert reply == {
        "ok": False,
        "id": 5,
        "error": {"code": "internal", "message": "internal error; see the controller log"},
    }
    assert [kind for kind, _ in reporter.seen] == ["started", "ended"]
    [event] = recorder.events
    assert event["action_id"] == reporter.seen[0][1] and event["native"] == [{"type": "page_info"}]


async def test_a_request_over_its_timeout_fails_with_timeout() -> None:
    never = asyncio.Event()

    class Stuck(FakeBrowser):
        async def navigate(self, url: str, wait_until: str, timeout_ms: int) -> dict[str, Any]:
            await never.wait()
            raise AssertionError("unreachable")

    dispatcher, reporter, _ = _dispatcher(Stuck)
    message = {"id": 6, "timeout_ms": 10, "action": {"type": "navigate", "url": "https://page.test/"}}
    reply = await dispatcher.handle(json.dumps(message))
    assert (reply["ok"], reply["error"]["code"], reply["error"]["field"]) == (False, "timeout", "timeout_ms")
    assert [kind for kind, _ in reporter.seen] == ["started", "ended"]


async def test_file_actions_run_as_the_agent_outside_the_desktops_lock(tmp_path: Path) -> None:
    reporter, recorder = Reporter(), Recorder()
    desktop = fake_desktop(Parts())
    desktop.files = AgentFiles(FakeAgentFs(), workspace=str(tmp_path))
    dispatcher = Dispatcher(desktop, Limits(), reporter, recorder)  # type: ignore[arg-type]
    message = json.dumps({"id": 7, "action": {"type": "file_write", "path": "a.txt", "content": "hi"}})
    assert dispatcher.read(message).apart is True  # served beside the desktop's requests
    async with desktop.lock:  # a long desktop action in flight
        reply = await asyncio.wait_for(dispatcher.handle(message), 5)
    assert reply["ok"] is True and reply["result"]["path"] == str(tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_text() == "hi"
    assert reporter.seen == []  # nothing for the proxy to attribute
    assert recorder.events[0]["native"][0]["type"] == "file_write"
    failed = await dispatcher.handle('{"id": 8, "action": {"type": "file_read", "path": "missing"}}')
    assert failed["ok"] is False and failed["error"]["code"] == "no_such_file"
    assert failed["error"]["field"] == "action.path"


async def test_the_secrets_action_answers_the_placeholders_outside_the_desktops_lock() -> None:
    dispatcher, reporter, recorder = _dispatcher()
    message = '{"id": 9, "action": {"type": "secrets"}}'
    assert dispatcher.read(message).apart is True
    async with dispatcher.desktop.lock:  # a long desktop action in flight
        empty = await asyncio.wait_for(dispatcher.handle(message), 5)
        placeholder = "corral_secret_" + "ab" * 16
        dispatcher.desktop.placeholders.replace({"GITHUB_TOKEN": placeholder})
        reply = await asyncio.wait_for(dispatcher.handle(message), 5)
    assert empty["ok"] is True and empty["result"] == {"secrets": {}}
    assert (reply["ok"], reply["id"], reply["result"]) == (True, 9, {"secrets": {"GITHUB_TOKEN": placeholder}})
    assert reporter.seen == []  # no request leaves the sandbox
    assert [event["native"] for event in recorder.events] == [[{"type": "secrets"}]] * 2
    refused = await dispatcher.handle('{"id": 10, "action": {"type": "secrets", "name": "GITHUB_TOKEN"}}')
    assert refused["ok"] is False and refused["error"]["code"] == "unknown_field"
    assert refused["error"]["field"] == "action.name"


async def test_file_actions_without_a_launcher_are_unsupported() -> None:
    dispatcher, _, _ = _dispatcher()
    dispatcher.desktop.files = None
    reply = await dispatcher.handle('{"action": {"type": "file_stat", "path": "/"}}')
    assert reply["ok"] is False and reply["error"]["code"] == "unsupported"


async def test_a_process_action_runs_apart_from_the_desktops_turn() -> None:
    dispatcher, reporter, recorder = _dispatcher()
    exec_message = json.dumps({"id": 1, "action": {"type": "exec", "argv": ["true"]}})
    assert dispatcher.read(exec_message).apart is True
    assert dispatcher.read(json.dumps({"id": 2, "action": {"type": "screenshot"}})).apart is False
    assert dispatcher.read("not json").apart is False
    # While a desktop action holds the lock, a process action is still answered.
    async with dispatcher.desktop.lock:
        reply = await asyncio.wait_for(dispatcher.handle(exec_message), 5)
    assert reply["ok"] is True and reply["id"] == 1 and reply["result"] == STARTED.wire()
    assert reporter.seen == []  # its commands' traffic carries their action id as the proxy username
    assert [event["action_id"] for event in recorder.events] == [reply["action_id"]]


async def test_events_carry_the_order_their_requests_came_in_whatever_order_they_end_in() -> None:
    dispatcher, _, recorder = _dispatcher()
    # A long request read first, one read while it runs (a process_kill beside its exec) ending first.
    first = dispatcher.read('{"id": 1, "action": {"type": "move", "x": 1, "y": 2}}')
    second = dispatcher.read('{"id": 2, "action": {"type": "move", "x": 3, "y": 4}}')
    await dispatcher.run(second)
    await dispatcher.run(first)
    assert [(e["request"]["id"], e["request_seq"]) for e in recorder.events] == [(2, 2), (1, 1)]
    refused = await dispatcher.handle("{not json")
    assert refused["ok"] is False and recorder.events[-1]["request_seq"] == 3  # refused requests count too


async def test_a_reply_over_a_frame_is_a_too_large_failure_with_the_vendor_form() -> None:
    # A frame over 16 MiB made the gateway close the connection (1009), dropping every request on it.
    dispatcher, _, _ = _dispatcher()

    async def huge(action: Any, *context: Any) -> r.ToolOutput:
        return r.ToolOutput(output="\x00" * (3 << 20), path="/workspace/x")  # 18 MiB of JSON escapes

    dispatcher.desktop.editor.run = huge  # type: ignore[method-assign]
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "str_replace_based_edit_tool"}
    block = {**tool_use, "input": {"command": "view", "path": "/workspace/x"}}
    out = await dispatcher.handle(json.dumps({"id": 3, "anthropic": block}))
    assert out["ok"] is False and out["error"]["code"] == "too_large"
    assert out["result"]["tool_result"]["is_error"] is True
    assert len(json.dumps(out)) < 10_000
    del dispatcher.desktop.editor.run  # the fake's own: a small reply goes out as it is
    small = await dispatcher.handle(json.dumps({"id": 4, "action": {"type": "edit", "command": "view", "path": "/x"}}))
    assert small["ok"] is True
