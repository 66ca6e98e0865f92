"""cdpturn: what a CDP connection lets go at a person's take and sets up again at the hand-back, and
what of Chromium's reaches it in between."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.contracts.cdprules import Command
from corral.sandbox.web.cdpturn import OWN_IDS, Own, Turn, downloads_in_place, event_method


def _sent(turn: Turn, id: int, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> None:
    command = Command(id, method, params, session)
    turn.sent(command)
    assert turn.goes(command)


def _event(method: str, params: dict[str, Any], session: str | None = None) -> str:
    out: dict[str, Any] = {"method": method, "params": params}
    if session is not None:
        out["sessionId"] = session
    return json.dumps(out, separators=(",", ":"))


def _attached(session: str, parent: str | None = None, waiting: bool = False) -> str:
    info = {"targetId": "T" + session, "type": "page", "url": "https://bank.test/", "title": "Bank"}
    return _event(
        "Target.attachedToTarget", {"sessionId": session, "targetInfo": info, "waitingForDebugger": waiting}, parent
    )


AUTO = {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}
PATTERNS = {"patterns": [{"urlPattern": "*"}]}
DOWNLOADS = {"behavior": "allowAndName", "downloadPath": "/tmp/d", "eventsEnabled": True}


def _set_up(turn: Turn) -> None:
    _sent(turn, 1, "Target.setAutoAttach", AUTO)
    _sent(turn, 2, "Target.setDiscoverTargets", {"discover": True})
    _sent(turn, 3, "Fetch.enable", PATTERNS)
    _sent(turn, 4, "Browser.setDownloadBehavior", DOWNLOADS)
    _sent(turn, 5, "Fetch.enable", PATTERNS, "S1")  # a session's own: goes with the session
    for n in range(1, 6):
        assert turn.answered((None if n < 5 else "S1", n))
    assert turn.event(_attached("S1")) == (True, [])
    assert turn.event(_attached("S2", parent="S1", waiting=True)) == (True, [])


def test_the_take_lets_go_of_browser_settings_first_then_every_session() -> None:
    turn = Turn()
    _set_up(turn)
    assert turn.begin() == []
    assert turn.let_go() == [
        Own("Target.setAutoAttach", {"autoAttach": False, "waitForDebuggerOnStart": False, "flatten": True}),
        Own("Target.setDiscoverTargets", {"discover": False}),
        Own("Fetch.disable", {}),
        Own("Browser.setDownloadBehavior", {"behavior": "default"}),
        Own("Target.detachFromTarget", {"sessionId": "S1"}),
        Own("Target.detachFromTarget", {"sessionId": "S2"}),
    ]


def test_the_hand_back_sets_up_again_what_the_client_last_gave_auto_attach_last() -> None:
    turn = Turn()
    _set_up(turn)
    turn.begin()
    assert turn.end() == [
        Own("Browser.setDownloadBehavior", DOWNLOADS),
        Own("Fetch.enable", PATTERNS),
        Own("Target.setDiscoverTargets", {"discover": True}),
        Own("Target.setAutoAttach", AUTO),
    ]
    assert not turn.muzzled


def test_what_the_client_switched_off_is_not_set_up_again() -> None:
    turn = Turn()
    _set_up(turn)
    _sent(turn, 6, "Fetch.disable")
    _sent(turn, 7, "Target.setAutoAttach", {"autoAttach": False, "waitForDebuggerOnStart": False, "flatten": True})
    _sent(turn, 8, "Target.setDiscoverTargets", {"discover": False})
    _sent(turn, 9, "Browser.setDownloadBehavior", {"behavior": "default"})
    assert turn.event(_event("Target.detachedFromTarget", {"sessionId": "S1"})) == (True, [])
    turn.begin()
    assert turn.let_go() == [Own("Target.detachFromTarget", {"sessionId": "S2"})]
    assert turn.end() == []


def test_commands_in_flight_at_the_take_are_cut_and_their_answers_dropped() -> None:
    turn = Turn()
    _sent(turn, 1, "Runtime.evaluate", {"expression": "keys()", "awaitPromise": True}, "S1")
    _sent(turn, 2, "Browser.getVersion")
    assert turn.answered((None, 2))
    assert turn.begin() == [("S1", 1)]
    assert not turn.answered(("S1", 1))  # the person's keystrokes resolved it: dropped
    _sent(turn, 3, "Browser.getVersion")  # sent during the turn (allowed): answered
    assert turn.answered((None, 3))
    turn.end()
    assert turn.answered(("S1", 1))  # an id used again later is the client's again


def test_in_a_persons_turn_only_a_sessions_going_passes_and_new_sessions_are_let_go() -> None:
    turn = Turn()
    turn.begin()
    request = _event("Network.requestWillBeSent", {"request": {"postData": "password=x"}}, "S1")
    assert turn.event(request) == (False, [])
    assert turn.event(_event("Runtime.consoleAPICalled", {"args": []}, "S1")) == (False, [])
    assert turn.event(_event("Target.targetCreated", {"targetInfo": {}})) == (False, [])
    assert turn.event(_attached("S9", waiting=True)) == (False, [Own("Target.detachFromTarget", {"sessionId": "S9"})])
    assert turn.event(_event("Target.detachedFromTarget", {"sessionId": "S9"})) == (True, [])
    turn.end()
    assert turn.event(request) == (True, [])


def test_the_relays_own_commands_take_ids_of_their_own_and_are_never_answered_to_the_client() -> None:
    turn = Turn()
    wire = json.loads(turn.own_wire(Own("Target.detachFromTarget", {"sessionId": "S1"})))
    assert wire == {"id": OWN_IDS + 1, "method": "Target.detachFromTarget", "params": {"sessionId": "S1"}}
    assert json.loads(turn.own_wire(Own("Debugger.resume", {}, "S2")))["sessionId"] == "S2"
    assert not turn.answered((None, OWN_IDS + 1))
    assert turn.answered((None, OWN_IDS + 1))  # answered once: a later frame of that id is not ours


def test_an_events_method_is_read_from_its_head() -> None:
    assert event_method('{"method":"Network.dataReceived","params":{}}') == "Network.dataReceived"
    assert event_method(b'{"method":"Page.loadEventFired","params":{}}') == "Page.loadEventFired"
    assert event_method('{"id":1,"result":{}}') is None


def test_a_command_a_take_cut_on_its_way_never_goes_nor_is_set_up_again() -> None:
    turn = Turn()
    command = Command(1, "Fetch.enable", PATTERNS, None)
    turn.sent(command)
    assert turn.begin() == [(None, 1)]  # taken between the check and the send
    assert not turn.goes(command)
    assert turn.let_go() == [] and turn.end() == []


@pytest.mark.parametrize(
    ("method", "params", "goes"),
    [
        # Playwright's and Puppeteer's own folders, which are no paths in the sandbox: Corral's place,
        # the client's context and events kept.
        (
            "Browser.setDownloadBehavior",
            {"behavior": "allowAndName", "downloadPath": "/tmp/pw-artifacts", "eventsEnabled": True},
            {"behavior": "default", "eventsEnabled": True},
        ),
        (
            "Browser.setDownloadBehavior",
            {"behavior": "allow", "downloadPath": "/Users/me/Downloads", "browserContextId": "CTX"},
            {"behavior": "default", "browserContextId": "CTX"},
        ),
        ("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": "/tmp/x"}, {"behavior": "default"}),
        # What saves nothing, or saves where the policy says, goes as it came.
        ("Browser.setDownloadBehavior", {"behavior": "deny"}, {"behavior": "deny"}),
        ("Browser.setDownloadBehavior", {"behavior": "default"}, {"behavior": "default"}),
        (
            "Page.navigate",
            {"url": "https://x.test/", "behavior": "allow"},
            {"url": "https://x.test/", "behavior": "allow"},
        ),
    ],
)
def test_a_client_s_download_folder_becomes_corral_s_place(
    method: str, params: dict[str, Any], goes: dict[str, Any]
) -> None:
    command = Command(7, method, params, None)
    assert downloads_in_place(command) == Command(7, method, goes, None)


def test_a_client_s_download_events_go_at_the_take_and_come_back_at_the_hand_back() -> None:
    turn = Turn()
    command = downloads_in_place(Command(3, "Browser.setDownloadBehavior", DOWNLOADS, None))
    turn.sent(command)
    assert turn.goes(command)
    turn.begin()
    assert Own("Browser.setDownloadBehavior", {"behavior": "default"}) in turn.let_go()
    assert Own("Browser.setDownloadBehavior", {"behavior": "default", "eventsEnabled": True}) in turn.end()
