"""cdprules: which CDP commands are refused and by which rule, which need the lease, and the CDP
error replies the relay answers with."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from corral.contracts import cdprules
from corral.contracts.cdprules import Command
from corral.errors import ActionError, ErrorCode
from corral.protocol.actions import NativeAction
from corral.protocol.validation import validate


@pytest.mark.parametrize(
    ("method", "params", "rule"),
    [
        ("Browser.crash", {}, "browser_lifecycle"),
        ("Browser.crashGpuProcess", None, "browser_lifecycle"),
        ("Target.createBrowserContext", {"proxyServer": "http://elsewhere.test:3128"}, "proxy_settings"),
        ("Target.createBrowserContext", {"proxyBypassList": "*"}, "proxy_settings"),
        ("Target.createBrowserContext", {"originsWithUniversalNetworkAccess": ["https://a.test"]}, "proxy_settings"),
        ("Target.exposeDevToolsProtocol", {"targetId": "T"}, "devtools_to_page"),
        ("Target.setRemoteLocations", {"locations": []}, "network_bypass"),
        ("Tethering.bind", {"port": 9000}, "network_bypass"),
        ("Tethering.unbind", {"port": 9000}, "network_bypass"),
    ],
)
def test_refused_commands_name_their_rule(method: str, params: dict[str, Any] | None, rule: str) -> None:
    found = cdprules.refusal(method, params)
    assert found is not None and found.name == rule


def test_browser_close_is_no_refusal_but_ends_the_connection() -> None:
    assert cdprules.refusal("Browser.close", None) is None and "Browser.close" in cdprules.ENDS_CONNECTION
    assert cdprules.ok_reply(4, None) == {"id": 4, "result": {}}
    assert cdprules.ok_reply(5, "S") == {"id": 5, "sessionId": "S", "result": {}}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("Target.createBrowserContext", None),
        ("Target.createBrowserContext", {"disposeOnDetach": True}),
        ("Target.createBrowserContext", {"proxyServer": None}),
        ("Browser.getVersion", None),
        ("Page.navigate", {"url": "https://example.test/"}),
        ("Runtime.evaluate", {"expression": "1"}),
        ("Target.setDiscoverTargets", {"discover": True}),
        ("BrowserX.close", None),
    ],
)
def test_other_commands_pass(method: str, params: dict[str, Any] | None) -> None:
    assert cdprules.refusal(method, params) is None


@pytest.mark.parametrize(
    "method",
    [
        "Input.dispatchMouseEvent",
        "Input.insertText",
        "Page.navigate",
        "Page.reload",
        "Page.navigateToHistoryEntry",
        "Runtime.evaluate",
        "Runtime.callFunctionOn",
        "Target.createTarget",
        "Target.closeTarget",
        "Target.activateTarget",
    ],
)
def test_commands_that_drive_the_page_need_the_lease(method: str) -> None:
    assert cdprules.needs_lease(method)


@pytest.mark.parametrize(
    "method",
    [
        "Page.captureScreenshot",
        "Runtime.enable",
        "Target.getTargets",
        "DOM.getDocument",
        "DOM.describeNode",
        "DOM.querySelectorAll",
        "DOM.resolveNode",
        "Runtime.getProperties",
        "Fetch.disable",
    ],
)
def test_reading_needs_no_lease(method: str) -> None:
    assert not cdprules.needs_lease(method)


def test_a_refusal_is_a_cdp_error_naming_the_method_and_rule() -> None:
    reply = cdprules.refused_reply(7, "S1", "Browser.close", cdprules.BROWSER_LIFECYCLE)
    assert reply["id"] == 7 and reply["sessionId"] == "S1"
    assert reply["error"]["code"] == -32000
    assert reply["error"]["message"].startswith("corral refused Browser.close: ")
    assert reply["error"]["message"].endswith("(rule browser_lifecycle)")
    assert "sessionId" not in cdprules.refused_reply(1, None, "Browser.close", cdprules.BROWSER_LIFECYCLE)


def test_control_taken_names_the_holder_and_since() -> None:
    reply = cdprules.control_taken_reply(3, None, "human:lnk_3kq9x0a1b2c4", 1733000000.5)
    assert reply == {
        "id": 3,
        "error": {"code": -32001, "message": "control_taken: held by human:lnk_3kq9x0a1b2c4 since 1733000000.5"},
    }


def test_every_rule_has_a_distinct_name() -> None:
    names = [rule.name for rule in cdprules.RULES]
    assert len(set(names)) == len(names) == 6


def test_parse_reads_commands_and_says_what_is_wrong() -> None:
    assert cdprules.parse({"id": 1, "method": "Page.enable", "sessionId": "S"}) == Command(1, "Page.enable", None, "S")
    assert cdprules.parse({"id": 2, "method": "Page.navigate", "params": {"url": "u"}}) == Command(
        2, "Page.navigate", {"url": "u"}, None
    )
    assert isinstance(cdprules.parse([1]), str)
    assert isinstance(cdprules.parse({"id": 1}), str)
    assert isinstance(cdprules.parse({"id": "1", "method": "Page.enable"}), str)
    assert isinstance(cdprules.parse({"id": True, "method": "Page.enable"}), str)
    assert isinstance(cdprules.parse({"id": 2**80, "method": "Page.enable"}), str)
    assert isinstance(cdprules.parse({"id": 1, "method": "Page.enable", "params": []}), str)
    assert isinstance(cdprules.parse({"id": 1, "method": "Page.enable", "sessionId": 5}), str)


@pytest.mark.parametrize(
    ("method", "params", "rule"),
    [
        ("Page.crash", None, "browser_lifecycle"),
        (
            "Target.sendMessageToTarget",
            {"message": '{"id":1,"method":"Browser.close"}', "sessionId": "S"},
            "flat_sessions",
        ),
        ("Target.attachToTarget", {"targetId": "T"}, "flat_sessions"),
        ("Target.attachToTarget", {"targetId": "T", "flatten": False}, "flat_sessions"),
        ("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False}, "flat_sessions"),
        ("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": 1}, "flat_sessions"),
        ("Target.openDevTools", {"targetId": "T"}, "internal_pages"),
        ("Page.navigate", {"url": "chrome://crash"}, "internal_pages"),
        ("Page.navigate", {"url": "CHROME://quit/"}, "internal_pages"),
        ("Page.navigate", {"url": " \tchrome://kill"}, "internal_pages"),
        ("Page.navigate", {"url": "chr\nome://hang"}, "internal_pages"),
        ("Page.navigate", {"url": "chrome://inducebrowsercrashforrealz"}, "internal_pages"),
        ("Page.navigate", {"url": "devtools://devtools/bundled/inspector.html"}, "internal_pages"),
        ("Page.navigate", {"url": "file:///etc/passwd"}, "internal_pages"),
        ("Page.navigate", {"url": "javascript:alert(1)"}, "internal_pages"),
        ("Page.navigate", {"url": "about:gpu"}, "internal_pages"),
        ("Page.navigate", {"url": "about:blankx"}, "internal_pages"),
        ("Page.navigate", {"url": 5}, "internal_pages"),
        ("Target.createTarget", {"url": "chrome://restart"}, "internal_pages"),
        ("Target.createTarget", {"url": "chrome://gpucrash"}, "internal_pages"),
    ],
)
def test_non_flat_sessions_crashes_and_internal_pages_are_refused(
    method: str, params: dict[str, Any] | None, rule: str
) -> None:
    found = cdprules.refusal(method, params)
    assert found is not None and found.name == rule


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("Target.attachToTarget", {"targetId": "T", "flatten": True}),
        ("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}),
        ("Target.attachToBrowserTarget", None),  # always a flat session
        ("Page.navigate", {"url": "HTTPS://a.test/"}),
        ("Page.navigate", {"url": "http://a.test/x?chrome://crash"}),
        ("Page.navigate", {"url": "data:text/html,<p>hi"}),
        ("Page.navigate", {"url": "blob:https://a.test/1f0e"}),
        ("Page.navigate", {"url": "about:blank"}),
        ("Page.navigate", {"url": "about:blank#x"}),
        ("Target.createTarget", {"url": "about:blank", "browserContextId": "C"}),
        ("Target.createTarget", {"url": ""}),
    ],
)
def test_flat_sessions_and_web_pages_pass(method: str, params: dict[str, Any] | None) -> None:
    assert cdprules.refusal(method, params) is None


# What Playwright's connect_over_cdp sends before it returns (DEBUG=pw:protocol, Playwright 1.5x).
PLAYWRIGHT_CONNECTS = [
    ("Browser.getVersion", None),
    ("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}),
    ("Browser.setDownloadBehavior", {"behavior": "allowAndName", "downloadPath": "/tmp/x", "eventsEnabled": True}),
    ("Runtime.runIfWaitingForDebugger", None),
    ("Page.enable", None),
    ("Page.getFrameTree", None),
    ("Log.enable", {}),
    ("Page.setLifecycleEventsEnabled", {"enabled": True}),
    ("Runtime.enable", {}),
    ("Page.addScriptToEvaluateOnNewDocument", {"source": "", "worldName": "__playwright_utility_world_page@1"}),
    ("Network.enable", None),
    ("Emulation.setFocusEmulationEnabled", {"enabled": True}),
    ("Page.setFontFamilies", {"fontFamilies": {"standard": "Times New Roman"}}),
    ("Emulation.setEmulatedMedia", {"media": "", "features": []}),
    ("Inspector.enable", None),
    ("Target.getTargetInfo", None),
    ("Target.detachFromTarget", {"sessionId": "S"}),
    ("Page.createIsolatedWorld", {"frameId": "F", "grantUniveralAccess": True, "worldName": "w"}),
]


@pytest.mark.parametrize(("method", "params"), PLAYWRIGHT_CONNECTS)
def test_connecting_needs_no_lease(method: str, params: dict[str, Any] | None) -> None:
    assert not cdprules.needs_lease(method, params)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("Runtime.compileScript", {"expression": "x", "sourceURL": "", "persistScript": True}),
        ("Runtime.runScript", {"scriptId": "1"}),
        ("Debugger.evaluateOnCallFrame", {"callFrameId": "c", "expression": "x"}),
        ("Debugger.pause", None),
        ("Page.setDocumentContent", {"frameId": "F", "html": "<p>"}),
        ("DOM.setAttributeValue", {"nodeId": 1, "name": "value", "value": "x"}),
        ("DOM.setOuterHTML", {"nodeId": 1, "outerHTML": "<p>"}),
        ("DOM.focus", {"nodeId": 1}),
        ("Page.addScriptToEvaluateOnNewDocument", {"source": "document.title = 1"}),
        ("Page.close", None),
        ("Page.stopLoading", None),
        ("Page.handleJavaScriptDialog", {"accept": True}),
        ("Page.bringToFront", None),
        ("Fetch.fulfillRequest", {"requestId": "r", "responseCode": 200}),
        ("Fetch.continueRequest", {"requestId": "r", "url": "https://b.test/"}),
        ("Fetch.failRequest", {"requestId": "r", "errorReason": "Failed"}),
        ("Emulation.setDeviceMetricsOverride", {"width": 1, "height": 1, "deviceScaleFactor": 1, "mobile": False}),
        ("Browser.setWindowBounds", {"windowId": 1, "bounds": {"windowState": "minimized"}}),
        ("Network.setCookie", {"name": "a", "value": "b"}),
        ("Storage.clearDataForOrigin", {"origin": "https://a.test", "storageTypes": "all"}),
        ("Input.getSomething", None),  # get<X> reads, but the whole Input domain acts; an unknown method waits too
        ("Some.newMethod", None),
        ("Page.getter", None),  # get, then no capital: not a read by name
    ],
)
def test_everything_else_needs_the_lease(method: str, params: dict[str, Any] | None) -> None:
    assert cdprules.needs_lease(method, params)


def test_a_paused_request_may_go_on_unchanged_without_the_lease() -> None:
    assert not cdprules.needs_lease("Fetch.continueRequest", {"requestId": "r"})


def test_repeated_keys_are_no_cdp_message_and_what_goes_is_what_was_read() -> None:
    with pytest.raises(ValueError, match="repeats a key"):
        cdprules.loads('{"id":1,"method":"Page.enable","method":"Browser.close"}')
    with pytest.raises(ValueError):
        cdprules.loads('{"id":1,"method":"Page.navigate","params":{"url":"https://a.test/","url":"chrome://crash"}}')
    command = cdprules.parse(cdprules.loads('{"id":1,"method":"Page.enable","sessionId":"S","extra":{"x":1}}'))
    assert isinstance(command, Command)
    assert command.wire() == {"id": 1, "method": "Page.enable", "sessionId": "S"}
    assert Command(2, "Page.navigate", {"url": "u"}, None).wire() == {
        "id": 2,
        "method": "Page.navigate",
        "params": {"url": "u"},
    }


@pytest.mark.parametrize(
    "method",
    [
        "Network.enable",
        "Fetch.enable",
        "Debugger.enable",
        "Runtime.enable",
        "Log.enable",
        "Console.enable",
        "Page.enable",
        "DOM.getDocument",
        "DOM.getOuterHTML",
        "DOM.querySelector",
        "DOM.resolveNode",
        "DOMSnapshot.captureSnapshot",
        "Runtime.getProperties",
        "Runtime.evaluate",
        "Runtime.runIfWaitingForDebugger",
        "Network.getResponseBody",
        "Network.getRequestPostData",
        "Page.captureScreenshot",
        "Page.getFrameTree",
        "Target.setAutoAttach",
        "Target.attachToTarget",
        "Target.getTargets",
        "Target.setDiscoverTargets",
        "Browser.setDownloadBehavior",
        "Fetch.continueRequest",
        "Input.dispatchKeyEvent",
        "Some.methodNobodyKnows",
    ],
)
def test_a_persons_turn_refuses_every_read_and_every_enable(method: str) -> None:
    # What is a read while another connection holds the lease reveals the person's input in theirs.
    assert not cdprules.allowed_in_persons_turn(method)


@pytest.mark.parametrize(
    "method",
    [
        "Network.disable",
        "Fetch.disable",
        "Debugger.disable",
        "Runtime.disable",
        "Target.detachFromTarget",
        "Browser.getVersion",
        "Runtime.releaseObject",
        "Runtime.releaseObjectGroup",
    ],
)
def test_a_persons_turn_lets_a_connection_let_go(method: str) -> None:
    assert cdprules.allowed_in_persons_turn(method)


def test_only_a_sessions_going_reaches_a_connection_in_a_persons_turn() -> None:
    assert {"Target.detachedFromTarget", "Inspector.detached"} == cdprules.PERSONS_TURN_EVENTS


def test_a_frame_nested_past_the_parser_s_recursion_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nests too deep"):
        cdprules.loads('{"id":1,"params":' + "[" * 100_000 + "]" * 100_000 + "}")


NATIVE: TypeAdapter[NativeAction] = TypeAdapter(NativeAction)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.test/",
        "data:text/html,hi",
        "about:blank",
        "chrome://settings",
        " chrome://quit",
        "file:///etc/passwd",
        "view-source:https://example.test/",
        "devtools://devtools/bundled/inspector.html",
        "chrome-extension://abc/page.html",
        "about:version",
        "javascript:alert(1)",
        "mailto:a@example.test",
    ],
)
def test_cdp_and_native_navigate_refuse_the_same_pages(url: str) -> None:
    by_cdp = cdprules.refusal("Page.navigate", {"url": url}) is cdprules.INTERNAL_PAGES
    try:
        validate(NATIVE, {"type": "navigate", "url": url}, "action", tagged=True)
        natively = False
    except ActionError as exc:
        assert exc.code is ErrorCode.URL_REFUSED and exc.field == "action.url"
        natively = True
    assert by_cdp == natively
