"""cdprules: which CDP commands are refused and by which rule, which need the lease, and the CDP
error replies the relay answers with."""

from __future__ import annotations

from typing import Any

import pytest

from corral.sandbox import cdprules
from corral.sandbox.cdprules import Command


@pytest.mark.parametrize(
    ("method", "params", "rule"),
    [
        ("Browser.close", None, "browser_lifecycle"),
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


@pytest.mark.parametrize("method", ["Page.captureScreenshot", "Runtime.enable", "Target.getTargets", "DOM.getDocument"])
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
    assert isinstance(cdprules.parse({"id": 1, "method": "Page.enable", "params": []}), str)
    assert isinstance(cdprules.parse({"id": 1, "method": "Page.enable", "sessionId": 5}), str)
