"""What the egress addons share (corral.proxy.addons.state): actions in flight, per-connection
tunnels and pins, the audit journal before and after the log is open."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from corral.proxy.addons.state import MAX_ACTIONS, Actions, Connections, Journal, Tunnel
from corral.proxy.audit import GENESIS, AuditLog
from corral.proxy.policy import Decision
from corral.proxy.vetting import Verdict


def test_records_name_the_latest_action_in_flight_and_lost_ends_do_not_pile_up() -> None:
    actions = Actions()
    assert actions.current() is None
    actions.start("a1")
    actions.start("a2")
    assert actions.current() == "a2"
    actions.end("a2")
    assert actions.current() == "a1"
    for n in range(MAX_ACTIONS + 5):
        actions.start(f"b{n}")
    assert len(actions.ids()) == MAX_ACTIONS and "a1" not in actions.ids()  # the oldest went first


def test_a_client_s_tunnel_and_pins_are_forgotten_with_it() -> None:
    connections = Connections()
    verdict = Verdict(Decision(True, "allowed"), "allow")
    connections.tunnels["c1"] = Tunnel("a.test", 443, verdict, "203.0.113.1", 0)
    connections.pins[("c1", "203.0.113.2", 80)] = "b.test"
    connections.pins[("c2", "203.0.113.2", 80)] = "b.test"
    connections.resolved[("c1", "b.test", 80)] = ("203.0.113.2", verdict)
    connections.forget("c1")
    assert (list(connections.tunnels), list(connections.pins), connections.resolved) == (
        [],
        [("c2", "203.0.113.2", 80)],
        {},
    )


def test_the_journal_writes_nothing_until_the_log_is_open(tmp_path: Path) -> None:
    journal = Journal()
    journal.write("error", host="a.test", port=443, error="x", action=None)
    assert (journal.head, journal.records) == ({"seq": 0, "hash": GENESIS}, 0)
    journal.log = AuditLog(tmp_path / "audit.jsonl", "ses_1")
    journal.write("error", host="a.test", port=443, error="x", action=None)
    assert journal.records == 1 and journal.head["seq"] == 1
    journal.log.close()
