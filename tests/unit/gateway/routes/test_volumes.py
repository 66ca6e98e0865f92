"""``/v1/volumes`` and ``volume`` at create, over the fake runtime: named per key, one holder at a
time, released at the session's end, bounded by the settings, audited."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import SandboxError
from corral.gateway.app import create_app
from corral.gateway.volumes import VolumeLimits, Volumes
from corral.runtime import SandboxAddress, SandboxSpec

from .conftest import KEY, OTHER_KEY, LoopbackRuntime, TestClient, settings_for

AUTH = {"authorization": f"Bearer {KEY}"}
OTHER = {"authorization": f"Bearer {OTHER_KEY}"}


class FailingStarts(LoopbackRuntime):
    fail = False

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        if self.fail:
            raise SandboxError("no start today")
        return super().start_sandbox(spec)


@pytest.fixture()
def gw(tmp_path: Path) -> Iterator[tuple[TestClient, FailingStarts]]:
    runtime = FailingStarts()
    app = create_app(
        settings_for(tmp_path, pool_size=1, volume_default_mb=64, volume_max_mb=256, max_volumes_per_key=2),
        runtime=runtime,
    )
    with TestClient(app) as test_client:
        yield test_client, runtime


def test_a_volume_is_made_listed_got_and_deleted(gw: tuple[TestClient, FailingStarts]) -> None:
    client, runtime = gw
    made = client.post("/v1/volumes", json={"name": "work"}, headers=AUTH)
    assert made.status_code == 201
    assert made.json() | {"created_at": 0} == {
        "name": "work",
        "size_mb": 64,
        "used_bytes": 0,
        "in_use_by": None,
        "created_at": 0,
    }
    assert [v["name"] for v in client.get("/v1/volumes", headers=AUTH).json()] == ["work"]
    assert client.get("/v1/volumes/work", headers=AUTH).json()["size_mb"] == 64
    (image,) = runtime.volumes
    assert image.exists()
    assert client.delete("/v1/volumes/work", headers=AUTH).status_code == 204
    assert not image.exists()
    gone = client.get("/v1/volumes/work", headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "no volume 'work'"


def test_bad_volumes_are_refused_with_their_reason(gw: tuple[TestClient, FailingStarts]) -> None:
    client, _ = gw
    too_big = client.post("/v1/volumes", json={"name": "big", "size_mb": 257}, headers=AUTH)
    assert too_big.status_code == 422 and too_big.json()["error"]["field"] == "size_mb"
    bad_name = client.post("/v1/volumes", json={"name": "../etc"}, headers=AUTH)
    assert bad_name.status_code == 422 and bad_name.json()["error"]["field"] == "name"
    assert client.post("/v1/volumes", json={"name": "a"}, headers=AUTH).status_code == 201
    again = client.post("/v1/volumes", json={"name": "a"}, headers=AUTH)
    assert again.status_code == 409 and again.json()["error"]["code"] == "volume_exists"
    assert client.post("/v1/volumes", json={"name": "b", "size_mb": 16}, headers=AUTH).status_code == 201
    third = client.post("/v1/volumes", json={"name": "c"}, headers=AUTH)
    assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_volumes"
    # Another key has its own names and its own count.
    assert client.post("/v1/volumes", json={"name": "a"}, headers=OTHER).status_code == 201


def test_a_session_holds_its_volume_until_it_ends(gw: tuple[TestClient, FailingStarts]) -> None:
    client, runtime = gw
    client.post("/v1/volumes", json={"name": "work"}, headers=AUTH)
    created = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH).json()
    assert created["volume"] == "work" and created["from_pool"] is False  # a pooled sandbox has no volume
    spec = runtime.specs[-1]
    (mount,) = runtime.attached.values()
    assert spec.workspace_mount == str(mount.mountpoint)
    held = client.get("/v1/volumes/work", headers=AUTH).json()
    assert held["in_use_by"] == created["id"]

    second = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH)
    assert second.status_code == 409
    assert second.json()["error"] == {
        "code": "volume_in_use",
        "message": f"volume 'work' is held by session {created['id']}",
        "field": "volume",
    }
    busy = client.delete("/v1/volumes/work", headers=AUTH)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "volume_in_use"

    assert client.delete(f"/v1/sessions/{created['id']}", headers=AUTH).status_code == 204
    assert runtime.attached == {}
    assert client.get("/v1/volumes/work", headers=AUTH).json()["in_use_by"] is None
    again = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH)
    assert again.status_code == 201
    client.delete(f"/v1/sessions/{again.json()['id']}", headers=AUTH)
    assert client.delete("/v1/volumes/work", headers=AUTH).status_code == 204


def test_missing_and_another_keys_volume_are_404_naming_it(gw: tuple[TestClient, FailingStarts]) -> None:
    client, runtime = gw
    missing = client.post("/v1/sessions", json={"volume": "nope"}, headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"] == {"code": "not_found", "message": "no volume 'nope'", "field": "volume"}
    client.post("/v1/volumes", json={"name": "mine"}, headers=AUTH)
    theirs = client.post("/v1/sessions", json={"volume": "mine"}, headers=OTHER)
    assert theirs.status_code == 404 and theirs.json()["error"]["message"] == "no volume 'mine'"
    assert client.get("/v1/volumes/mine", headers=OTHER).status_code == 404
    assert client.delete("/v1/volumes/mine", headers=OTHER).status_code == 404
    assert client.get("/v1/volumes", headers=OTHER).json() == []
    assert runtime.attached == {}


def test_a_failed_start_lets_the_volume_go(gw: tuple[TestClient, FailingStarts]) -> None:
    client, runtime = gw
    client.post("/v1/volumes", json={"name": "work"}, headers=AUTH)
    runtime.fail = True
    failed = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH)
    assert failed.status_code == 503
    assert runtime.attached == {}
    assert client.get("/v1/volumes/work", headers=AUTH).json()["in_use_by"] is None


def test_each_claim_and_release_is_an_audit_record_with_sizes(
    gw: tuple[TestClient, FailingStarts], tmp_path: Path
) -> None:
    client, runtime = gw
    client.post("/v1/volumes", json={"name": "work"}, headers=AUTH)
    created = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH).json()
    (image,) = runtime.volumes
    runtime.used[image] = 12345
    assert client.get("/v1/volumes/work", headers=AUTH).json()["used_bytes"] == 12345  # statfs while mounted
    client.delete(f"/v1/sessions/{created['id']}", headers=AUTH)
    assert client.get("/v1/volumes/work", headers=AUTH).json()["used_bytes"] == 12345  # as it was left
    (audit,) = (tmp_path / "volumes" / "audit").iterdir()
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["event"], e.get("session"), e.get("used_bytes")) for e in events] == [
        ("create", None, None),
        ("claim", created["id"], 0),
        ("release", created["id"], 12345),
    ]
    assert all(e["size_mb"] == 64 and e["volume"] == "work" for e in events)


def test_recovery_keeps_live_holds_and_detaches_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = LoopbackRuntime()
        limits = VolumeLimits(64, 256, 4)
        volumes = Volumes(tmp_path, runtime, limits)
        for name in ("kept", "dropped"):
            await volumes.create("k", name, None)
        kept, dropped = await volumes.claim("k", "kept"), await volumes.claim("k", "dropped")
        await volumes.bind(kept, "ses_live")
        await volumes.bind(dropped, "ses_gone")
        stray = volumes.images / "vol_stray.img"
        stray.write_bytes(b"")
        # A new gateway over the same data dir and the same host.
        again = Volumes(tmp_path, runtime, limits)
        await again.recover({"ses_live"})
        assert [(v.name, v.in_use_by) for v in await again.owned("k")] == [("kept", "ses_live"), ("dropped", None)]
        assert [m.image.stem for m in runtime.attached.values()] == [kept.volume]
        assert not stray.exists()

    asyncio.run(scenario())


def test_a_session_token_cannot_reach_the_keys_volumes(gw: tuple[TestClient, FailingStarts]) -> None:
    """The agent holds its session's token: it must not list, make or delete its owner's volumes."""
    client, _ = gw
    client.post("/v1/volumes", json={"name": "work"}, headers=AUTH)
    token = client.post("/v1/sessions", json={"volume": "work"}, headers=AUTH).json()["token"]
    agent = {"authorization": f"Bearer {token}"}
    refused = [
        client.get("/v1/volumes", headers=agent),
        client.post("/v1/volumes", json={"name": "mine"}, headers=agent),
        client.delete("/v1/volumes/work", headers=agent),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [(401, "unauthorized")] * 3
    assert client.get("/v1/volumes/work", headers=AUTH).json()["in_use_by"] is not None  # untouched
