"""The live policy (corral.proxy.vetting): a target decided by name before any lookup, then by
every address it resolves to; report mode lets only the allowlist's refusals through."""

from __future__ import annotations

import json
from pathlib import Path

from corral.proxy.policy import Policy
from corral.proxy.vetting import LivePolicy

TABLE = {"public.test": ["203.0.113.5"], "rebind.test": ["203.0.113.6", "10.0.0.7"]}


async def _table(host: str, port: int) -> list[str]:
    if host not in TABLE:
        raise OSError(-2, "Name or service not known")
    return TABLE[host]


def _live(allow: list[str], mode: str = "enforce") -> LivePolicy:
    live = LivePolicy(_table)
    live.policy = Policy(allow, trusted_networks=["203.0.113.0/24"])
    live.mode = mode
    return live


async def test_an_allowed_name_is_pinned_to_its_first_vetted_address() -> None:
    ip, verdict = await _live(["public.test"]).vet("public.test", 443)
    assert (ip, verdict.outcome, verdict.decision.rule) == ("203.0.113.5", "allow", "public.test")


async def test_one_private_answer_refuses_the_name_before_any_dial() -> None:
    ip, verdict = await _live(["rebind.test"], mode="report").vet("rebind.test", 443)
    assert (ip, verdict.outcome, verdict.decision.rule, verdict.status) == (None, "deny", "global-deny", 403)


async def test_report_mode_lets_the_allowlist_s_refusal_through_with_its_address() -> None:
    ip, verdict = await _live([], mode="report").vet("public.test", 443)
    assert (ip, verdict.outcome, verdict.decision.rule) == ("203.0.113.5", "report", "default-deny")
    ip, verdict = await _live([]).vet("public.test", 443)
    assert (ip, verdict.outcome) == (None, "deny")


async def test_unresolvable_names_are_refused_with_502_and_hermetic_sessions_resolve_nothing() -> None:
    ip, verdict = await _live(["*.test"]).vet("nowhere.test", 443)
    assert (ip, verdict.outcome, verdict.decision.rule, verdict.status) == (None, "deny", "dns-error", 502)
    hermetic = _live(["*.test"])
    hermetic.hermetic = True
    ip, verdict = await hermetic.vet("nowhere.test", 443)
    assert (ip, verdict.outcome) == (None, "allow")


def test_the_policy_is_persisted_and_restored_with_its_mode_and_generation(tmp_path: Path) -> None:
    saved = tmp_path / "policy.json"
    live = LivePolicy(_table)
    assert live.restore(saved) == [] and (live.mode, live.generation) == ("enforce", 0)
    LivePolicy.persist(saved, ["a.test"], "report", 3)
    assert json.loads(saved.read_text()) == {"allow": ["a.test"], "mode": "report", "generation": 3}
    assert live.restore(saved) == ["a.test"] and (live.mode, live.generation) == ("report", 3)
    assert not saved.with_suffix(".tmp").exists()
