"""The refusal an agent sees (corral.proxy.refusal): a page naming the rule, or JSON when asked."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mitmproxy")

from corral.proxy.policy import Decision
from corral.proxy.refusal import NOT_RECORDED, refusal_response


def test_a_refusal_page_names_the_host_and_the_rule_escaped() -> None:
    response = refusal_response(403, "<b>.test", Decision(False, "not on the allowlist", "default-deny"), "text/html")
    page = response.get_text() or ""
    assert response.status_code == 403 and "&lt;b&gt;.test" in page and "<b>.test" not in page
    assert "Blocked by Corral" in page and "default-deny" in page
    assert (response.headers["X-Corral-Egress"], response.headers["X-Corral-Rule"]) == ("denied", "default-deny")
    assert response.headers["Cache-Control"] == "no-store"


def test_json_clients_get_the_refusal_as_json_and_replays_say_not_recorded() -> None:
    decision = Decision(False, "GET https://a.test/x is not in the recording", NOT_RECORDED)
    response = refusal_response(502, "a.test", decision, "application/json")
    assert json.loads(response.get_text() or "") == {
        "error": {"code": "not_recorded", "host": "a.test", "rule": NOT_RECORDED, "reason": decision.reason}
    }
    assert response.headers["X-Corral-Egress"] == "not-recorded"
    page = refusal_response(502, "a.test", decision, "text/html,application/json").get_text() or ""
    assert "Not in the recording" in page
