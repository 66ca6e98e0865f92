"""The gateway's egress archive: state directories, session metadata, listing and retention."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import stat
import time
from pathlib import Path

import pytest

from corral.errors import EgressUnavailable, ReplayNotFound, SandboxError
from corral.gateway.egress import EgressManager, PolicyView
from corral.gateway.egress.pairs import GROUND_MAX_AGE_S, GROUNDS_DIR
from corral.gateway.settings import GatewaySettings
from corral.runtime import ProxyAddress, ProxySpec, SandboxAddress, SandboxSpec

from ..runtime.fake import FakeRuntime


def _manager(tmp_path: Path) -> EgressManager:
    return EgressManager(GatewaySettings(data_dir=tmp_path), runtime=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["../etc", "ses_../x", "ses_a/b", "abc", "ses_"])
def test_state_dirs_are_only_for_session_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        _manager(tmp_path).state_dir(bad)


def test_logs_are_listed_per_key_and_pruned_after_retention(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    for sid, owner in (("ses_a1", "k1"), ("ses_b2", "k2"), ("ses_c3", "k1")):
        manager.state_dir(sid).mkdir(parents=True)
        manager.write_meta(sid, owner=owner, created_at=time.time(), ended_at=None)
    (manager.state_dir("ses_a1") / "audit.jsonl").write_text('{"seq":1}\n{"seq":2}\n')
    manager.write_meta("ses_c3", ended_at=time.time() - 10 * 86400)
    listed = {item["session"]: item for item in manager.logs("k1")}
    assert set(listed) == {"ses_a1", "ses_c3"}
    assert (listed["ses_a1"]["records"], listed["ses_a1"]["state"]) == (2, "live")
    assert listed["ses_c3"]["state"] == "ended"
    assert manager.prune(retention_s=86400, live={"ses_a1"}) == 1
    assert not manager.state_dir("ses_c3").exists() and manager.state_dir("ses_a1").exists()
    assert manager.meta("ses_zz") is None


def _grounded(tmp_path: Path, instance: str = "t") -> tuple[EgressManager, FakeRuntime]:
    runtime = FakeRuntime()
    return EgressManager(GatewaySettings(data_dir=tmp_path, instance=instance), runtime), runtime  # type: ignore[arg-type]


def test_a_ground_made_ahead_becomes_the_session_that_takes_it(tmp_path: Path) -> None:
    manager, runtime = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_g1", {"corral.gateway": "t"})
    assert ground.network.name in runtime.networks and ground.network.name in runtime.guarded
    marker = tmp_path / "egress" / GROUNDS_DIR / "ses_g1"
    assert marker.read_text() == "t" and not (ground.state_dir / "unclaimed").exists()
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600 and stat.S_IMODE(marker.parent.stat().st_mode) == 0o700
    assert "BEGIN CERTIFICATE" in ground.ca_cert and (ground.state_dir / "ca").is_dir()
    prepared = manager.prepare_blocking("ses_g1", ["a.test"], "enforce", {}, None, ground)
    assert prepared.network == ground.network and len(runtime.networks) == 1  # no second network
    assert prepared.sandbox_env["CORRAL_CA_CERT"] == ground.ca_cert
    assert json.loads((ground.state_dir / "policy.json").read_text())["allow"] == ["a.test"]
    assert not marker.exists()
    assert manager.remove_unclaimed_grounds() == []  # taken: its state is a session's now
    with pytest.raises(ValueError, match="not ses_other's"):
        manager.prepare_blocking("ses_other", [], "enforce", {}, None, ground)


def test_grounds_no_session_took_are_dropped_whole(tmp_path: Path) -> None:
    manager, runtime = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_g2", {})
    manager.drop_ground_blocking(ground)
    assert runtime.networks == {} and not ground.state_dir.exists()
    assert list((tmp_path / "egress" / GROUNDS_DIR).iterdir()) == []


def test_a_restarted_gateway_removes_only_its_own_unclaimed_grounds(tmp_path: Path) -> None:
    manager, _ = _grounded(tmp_path, instance="t")
    other, _ = _grounded(tmp_path, instance="u")
    mine = manager.make_ground_blocking("ses_g3", {})
    theirs = other.make_ground_blocking("ses_g4", {})
    taken = manager.make_ground_blocking("ses_g5", {})
    manager.prepare_blocking("ses_g5", [], "enforce", {}, None, taken)
    assert manager.remove_unclaimed_grounds() == ["ses_g3"]
    assert not mine.state_dir.exists() and theirs.state_dir.exists() and taken.state_dir.exists()


def test_a_proxy_cannot_have_a_restarted_gateway_delete_its_sessions_state(tmp_path: Path) -> None:
    manager, _ = _grounded(tmp_path)
    taken = manager.make_ground_blocking("ses_g6", {})
    manager.prepare_blocking("ses_g6", ["a.test"], "enforce", {}, None, taken)
    (taken.state_dir / "audit.jsonl").write_text('{"seq":1,"event":"proxy"}\n{"seq":2,"event":"request"}\n')
    # The attack: the session's proxy writes a marker naming this instance into its own state dir,
    # the one place it can write (the older gateways' marker's place), and waits for a restart.
    (taken.state_dir / "unclaimed").write_text("t")
    unclaimed = manager.make_ground_blocking("ses_g7", {})
    restarted, _ = _grounded(tmp_path)
    assert restarted.remove_unclaimed_grounds() == ["ses_g7"]  # the real one goes, whole
    assert not unclaimed.state_dir.exists() and not (tmp_path / "egress" / GROUNDS_DIR / "ses_g7").exists()
    assert (taken.state_dir / "audit.jsonl").read_text().count("\n") == 2  # the session's log is kept
    assert (taken.state_dir / "ca").is_dir()


@pytest.mark.parametrize("trace", ["policy.json", "session.json", "audit", "anchors"])
def test_a_marked_ground_holding_a_sessions_trace_is_kept(tmp_path: Path, trace: str) -> None:
    # Defence in depth: a marker that outlived its claim (or came from anywhere) deletes no session's state.
    manager, _ = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_g8", {})
    if trace == "audit":
        (ground.state_dir / "audit.jsonl").write_text('{"seq":1,"event":"proxy"}\n{"seq":2,"event":"policy"}\n')
    elif trace == "anchors":
        manager.record_start("ses_g8", [], "enforce")
    else:
        (ground.state_dir / trace).write_text("{}")
    assert manager.remove_unclaimed_grounds() == [] and (ground.state_dir / "ca").is_dir()
    assert not (tmp_path / "egress" / GROUNDS_DIR / "ses_g8").exists()  # said once, then forgotten


def test_a_ground_whose_proxy_only_started_is_still_unclaimed(tmp_path: Path) -> None:
    manager, _ = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_g9", {})
    (ground.state_dir / "audit.jsonl").write_text('{"seq":1,"event":"proxy"}\n{"seq":2,"event":"proxy"}\n')
    assert manager.remove_unclaimed_grounds() == ["ses_g9"] and not ground.state_dir.exists()


def test_a_ground_too_old_or_whose_ca_would_expire_during_a_session_is_not_fresh(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    settings = GatewaySettings(data_dir=tmp_path, instance="t", max_timeout_s=7 * 86400)
    manager = EgressManager(settings, runtime)  # type: ignore[arg-type]
    ground = manager.make_ground_blocking("ses_ga", {})
    now = time.time()
    assert 29 * 86400 < ground.ca_not_after - now <= 30 * 86400  # the CA ca.create makes: 30 days
    assert manager.ground_fresh(ground, now)
    assert not manager.ground_fresh(ground, now + GROUND_MAX_AGE_S + 1)  # held more than a day
    # A CA with 7 days and a few minutes left cannot serve a session of up to 7 days (plus the margin).
    assert not manager.ground_fresh(dataclasses.replace(ground, ca_not_after=now + 7 * 86400 + 300), now)
    assert manager.ground_fresh(dataclasses.replace(ground, ca_not_after=now + 7 * 86400 + 7200), now)


async def test_the_session_managers_ground_pool_hands_out_fresh_grounds_only(tmp_path: Path) -> None:
    from corral.gateway.app import build_sessions
    from corral.gateway.store import SessionStore

    runtime = FakeRuntime()
    settings = GatewaySettings(data_dir=tmp_path, instance="t", pool_size=0, record=False, ground_pool_size=1)
    sessions = build_sessions(settings, runtime, SessionStore(tmp_path))  # type: ignore[arg-type]
    await sessions.start()
    try:
        assert sessions.grounds is not None and sessions.egress is not None
        await asyncio.wait_for(sessions.grounds.filled.wait(), 10)
        (old,) = sessions.grounds.held()
        sessions.grounds._held[0] = dataclasses.replace(old, made_at=old.made_at - GROUND_MAX_AGE_S)
        assert sessions.grounds.take() is None  # too old: not taken, dropped
        await asyncio.wait_for(sessions.grounds.filled.wait(), 10)
        assert not old.state_dir.exists() and sessions.grounds.held()[0].session_id != old.session_id
    finally:
        await sessions.stop()


def _leftovers(tmp_path: Path, session_id: str) -> list[str]:
    egress = tmp_path / "egress"
    paths = [egress / session_id, egress / f"{session_id}.sandbox", egress / GROUNDS_DIR / session_id]
    paths.append(tmp_path / "audit-anchors" / f"{session_id}.jsonl")
    return [str(path.relative_to(tmp_path)) for path in paths if path.exists()]


def test_a_claim_that_fails_leaves_nothing_of_the_ground(tmp_path: Path) -> None:
    manager, runtime = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_gb", {})
    with pytest.raises(ReplayNotFound):
        manager.prepare_blocking("ses_gb", [], "enforce", {}, tmp_path / "deleted.mitm", ground)
    assert runtime.networks == {} and _leftovers(tmp_path, "ses_gb") == []


def test_a_discarded_start_leaves_nothing_on_disk(tmp_path: Path) -> None:
    manager, runtime = _grounded(tmp_path)
    prepared = manager.prepare_blocking("ses_gc", ["a.test"], "enforce", {}, None, None)
    assert _leftovers(tmp_path, "ses_gc") == ["egress/ses_gc", "egress/ses_gc.sandbox", "audit-anchors/ses_gc.jsonl"]
    manager.discard_blocking(prepared)
    assert runtime.networks == {} and _leftovers(tmp_path, "ses_gc") == []


class NoSandbox(FakeRuntime):
    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        raise SandboxError("the sandbox did not start")


@pytest.mark.parametrize("failure", ["sandbox", "proxy_never_answers"])
async def test_a_cold_start_that_fails_after_taking_a_ground_leaves_nothing(tmp_path: Path, failure: str) -> None:
    from corral.gateway.app import build_sessions
    from corral.gateway.models import CreateSession
    from corral.gateway.store import SessionStore

    runtime = NoSandbox() if failure == "sandbox" else FakeRuntime()
    settings = GatewaySettings(
        data_dir=tmp_path, instance="t", pool_size=0, record=False, ground_pool_size=1, start_timeout_s=0.3
    )
    sessions = build_sessions(settings, runtime, SessionStore(tmp_path))  # type: ignore[arg-type]
    await sessions.start()
    try:
        assert sessions.grounds is not None
        await asyncio.wait_for(sessions.grounds.filled.wait(), 10)
        (ground,) = sessions.grounds.held()
        assert sessions.egress is not None
        sessions.egress.control_port = 9  # nothing answers there: a proxy that never comes up
        with pytest.raises((SandboxError, EgressUnavailable)):
            await sessions.create("key-a", CreateSession(allow=["a.test"]))
        assert ground.session_id not in {g.session_id for g in sessions.grounds.held()}  # it was taken
        assert _leftovers(tmp_path, ground.session_id) == []
        assert ground.network.name not in runtime.networks and ground.session_id not in runtime.proxies
    finally:
        await sessions.stop()


class SpecRuntime(FakeRuntime):
    """Keeps each proxy's spec (its environment holds its tokens) and which containers were removed."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, ProxySpec] = {}
        self.removed: list[str] = []

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        self.specs[spec.session_id] = spec
        return super().start_proxy(spec)

    def remove(self, ident: str) -> None:
        self.removed.append(ident)
        for sid, (proxy, _, _) in list(self.proxies.items()):
            if ident in (proxy.id, proxy.name):
                del self.proxies[sid]
        super().remove(ident)


def test_a_grounds_proxy_starts_ahead_with_nothing_allowed_whatever_the_default_mode(tmp_path: Path) -> None:
    runtime = SpecRuntime()
    settings = GatewaySettings(data_dir=tmp_path, instance="t", egress_mode="report", audit_max_bytes=1 << 20)
    manager = EgressManager(settings, runtime)  # type: ignore[arg-type]
    ground = manager.make_ground_blocking("ses_gp", {"corral.gateway": "t"}, proxy=True)
    env = runtime.specs["ses_gp"].environment or {}
    assert env["CORRAL_AUDIT_MAX_BYTES"] == str(1 << 20)  # the log's budget, as the gateway's setting says
    # Enforce with no policy file (an empty allowlist): nothing passes until the session's policy is set.
    assert (env["CORRAL_EGRESS_MODE"], env["CORRAL_HERMETIC"]) == ("enforce", "0")
    assert not (ground.state_dir / "policy.json").exists()
    assert env["CORRAL_GATEWAY_TOKEN"] == manager.token("ses_gp")
    token = env["CORRAL_CONTROLLER_TOKEN"]
    token_file = tmp_path / "egress" / "ses_gp.sandbox" / "proxy-token"
    assert token_file.read_text() == token and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert ground.egress is not None and token not in repr(ground)
    prepared = manager.prepare_blocking("ses_gp", ["a.test"], "report", {}, None, ground)
    # Taken: the sandbox gets the running proxy's token file, and the proxy is the ground's.
    assert prepared.egress == ground.egress
    assert prepared.sandbox_files == {str(token_file): "/run/corral-secrets/proxy-token"}
    assert manager.expected("ses_gp") == PolicyView(0, (), "enforce")  # what the proxy runs until the policy call
    assert manager.unclaimed_grounds() == [] and "ses_gp" in runtime.proxies


def test_a_hermetic_session_taking_a_ground_gets_its_own_proxy(tmp_path: Path) -> None:
    runtime = SpecRuntime()
    manager = EgressManager(GatewaySettings(data_dir=tmp_path, instance="t"), runtime)  # type: ignore[arg-type]
    ground = manager.make_ground_blocking("ses_gh", {}, proxy=True)
    assert ground.egress is not None
    (ground.state_dir / "audit.jsonl").write_text('{"seq":1,"event":"proxy"}\n')
    replay = tmp_path / "replay.mitm"
    replay.write_bytes(b"flows")
    before = (tmp_path / "egress" / "ses_gh.sandbox" / "proxy-token").read_text()
    prepared = manager.prepare_blocking("ses_gh", ["a.test"], "enforce", {}, replay, ground)
    # The proxy started ahead (no hermetic replay, a way out) is gone with the chain it began.
    assert ground.egress.proxy_id in runtime.removed and "ses_gh" not in runtime.proxies
    assert prepared.egress is None and prepared.hermetic and prepared.environment["CORRAL_HERMETIC"] == "1"
    assert not (ground.state_dir / "audit.jsonl").exists() and (ground.state_dir / "replay.mitm").exists()
    token = (tmp_path / "egress" / "ses_gh.sandbox" / "proxy-token").read_text()
    assert token != before and prepared.environment["CORRAL_CONTROLLER_TOKEN"] == token


def test_a_ground_with_its_proxy_is_dropped_whole(tmp_path: Path) -> None:
    manager, runtime = _grounded(tmp_path)
    ground = manager.make_ground_blocking("ses_gd", {}, proxy=True)
    manager.drop_ground_blocking(ground)
    assert runtime.proxies == {} and runtime.networks == {} and _leftovers(tmp_path, "ses_gd") == []


def test_the_archive_counts_a_log_s_records_a_chunk_at_a_time(tmp_path: Path) -> None:
    from corral.gateway.egress.archive import size_and_lines

    log = tmp_path / "audit.jsonl"
    assert size_and_lines(log) == (0, 0)
    log.write_bytes(b'{"a":1}\n\n  \n{"b":2}\n' + b"x" * 5000 + b"\n" + b"{torn")
    for chunk in (1, 3, 7, 1 << 20):
        assert size_and_lines(log, chunk) == (log.stat().st_size, 4)
