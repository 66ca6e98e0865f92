"""Workspace volumes against the real images and a real gateway: a file keeps its bytes, owner and
modes across three sessions; one holder at a time; another key's volume does not exist; the quota
is a filesystem's (ENOSPC inside, what was written before intact); the agent's links, device nodes,
setuid bits and sparse giants do nothing on the host; the image goes with the volume; a restarted
gateway keeps a live session's hold. Every command in a sandbox runs as the agent's uid."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.gateway.sessions import GATEWAY_LABEL
from corral.gateway_client import Gateway
from corral.sdk import AsyncSandbox, Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway, traffic

pytestmark = pytest.mark.usefixtures("desktop_image")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gw-volumes")


@pytest.fixture(scope="module")
def instance(runtime: DockerHarness) -> Iterator[str]:
    name = f"volumes-{time.time_ns()}"
    yield name
    runtime.remove_all({GATEWAY_LABEL: name})


@pytest.fixture(scope="module")
def gw(data_dir: Path, instance: str) -> Iterator[RunningGateway]:
    with gateway(data_dir, instance, egress=False, volume_default_mb=64, record=False) as served:
        yield served


def _run(sb: Sandbox, command: str) -> str:
    result = sb.exec(command, cwd="/workspace")
    assert result.exit_code == 0, (command, result.stdout, result.stderr)
    return result.stdout


def _loops_of(images: Path) -> list[str]:
    listing = subprocess.run(["losetup", "--list", "--json"], capture_output=True, text=True, check=True).stdout
    devices = json.loads(listing or '{"loopdevices": []}')["loopdevices"]
    return [d["name"] for d in devices if str(d.get("back-file", "")).startswith(str(images))]


def test_a_file_keeps_its_bytes_owner_and_modes_across_three_sessions(gw: RunningGateway, data_dir: Path) -> None:
    with Gateway(gw.url, KEY_A) as owner:
        made = owner.create_volume("work", 64)
        assert (made.name, made.size_mb, made.in_use_by) == ("work", 64, None)

        with Sandbox.create(url=gw.url, api_key=KEY_A, volume="work") as first:
            assert first.info.volume == "work" and not first.info.from_pool
            mounts = _run(first, "grep ' /workspace ' /proc/self/mountinfo")
            assert "nosuid" in mounts and "nodev" in mounts
            _run(first, "printf 'one\\n' > notes.txt && chmod 0640 notes.txt")
            _run(
                first, "printf '#!/bin/sh\\necho ran as $(id -un)\\n' > run.sh && chmod 0750 run.sh && mkdir -m 0700 d"
            )
            assert owner.volume("work").in_use_by == first.id

            # Held: a second claim, another key, a missing name, a delete.
            with Gateway(gw.url, KEY_A) as again, gw.client(KEY_A) as http:
                second = http.post("/v1/sessions", json={"volume": "work"})
                assert second.status_code == 409
                assert second.json()["error"]["code"] == "volume_in_use"
                assert first.id in second.json()["error"]["message"]
                missing = http.post("/v1/sessions", json={"volume": "nowhere"})
                assert missing.status_code == 404 and "'nowhere'" in missing.json()["error"]["message"]
                busy = http.delete("/v1/volumes/work")
                assert busy.status_code == 409 and busy.json()["error"]["code"] == "volume_in_use"
                assert [v.name for v in again.volumes()] == ["work"]
            with gw.client(KEY_B) as other:
                assert other.post("/v1/sessions", json={"volume": "work"}).status_code == 404
                assert other.get("/v1/volumes/work").status_code == 404
                assert other.get("/v1/volumes").json() == []
        assert owner.volume("work").in_use_by is None
        assert _loops_of(data_dir / "volumes") == []  # released: unmounted and detached

        for n in (2, 3):
            with Sandbox.create(url=gw.url, api_key=KEY_A, volume="work") as later:
                listed = _run(later, "stat -c '%n %a %U:%G' notes.txt run.sh d")
                assert listed.splitlines() == [
                    "notes.txt 640 agent:agent",
                    "run.sh 750 agent:agent",
                    "d 700 agent:agent",
                ]
                assert _run(later, "./run.sh") == "ran as agent\n"
                _run(later, f"echo {n} >> notes.txt")
                assert _run(later, "ls -A") == "d\nnotes.txt\nrun.sh\n"  # no lost+found: only the owner's files
        used = owner.volume("work").used_bytes
        assert 0 < used < 1 << 20
        assert asyncio.run(_read_async(gw, "notes.txt")) == "one\n2\n3\n"  # the async SDK's create too


async def _read_async(gw: RunningGateway, path: str) -> str:
    async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A, volume="work") as sb:
        result = await sb.exec(argv=["cat", path], cwd="/workspace")
        assert result.exit_code == 0, result.stderr
        return result.stdout


def test_the_quota_and_the_agents_tricks_stay_inside(gw: RunningGateway, data_dir: Path, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("host file\n")
    images = data_dir / "volumes" / "images"
    assert images.is_dir()
    with Gateway(gw.url, KEY_A) as owner:
        owner.create_volume("small", 32)
        image = _image_of(data_dir, "small")
        with Sandbox.create(url=gw.url, api_key=KEY_A, volume="small") as sb:
            _run(sb, "head -c 1048576 /dev/urandom > before.bin && sync")
            before = _run(sb, "sha256sum before.bin").split()[0]
            # Links to the host's paths, a device node, a setuid file, a sparse giant.
            _run(sb, f"ln -s {canary} canary && ln -s / root && ln -s /etc/shadow shadow")
            node = sb.exec("mknod ./null c 1 3", cwd="/workspace")
            assert node.exit_code != 0 and "Operation not permitted" in node.stderr
            _run(sb, "cp /usr/bin/id ./suid-id && chmod 4755 ./suid-id && truncate -s 10G sparse")
            assert _run(sb, "./suid-id -u") == "1100\n"
            # On the host too the mount is nosuid,nodev: a host user of the agent's uid gains nothing.
            (host_mount,) = [
                line
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if str(images.parent / "mnt") in line
            ]
            assert "nosuid" in host_mount and "nodev" in host_mount
            # Filling it: ENOSPC inside, at the quota, and what was there before intact.
            fill = sb.exec("dd if=/dev/zero of=fill bs=1M count=64", cwd="/workspace")
            assert fill.exit_code != 0 and "No space left on device" in fill.stderr
            assert _run(sb, "sha256sum before.bin").split()[0] == before
            full = owner.volume("small")
            assert full.in_use_by == sb.id and full.used_bytes > 24 << 20  # statfs: the sparse 10G counts nothing
            many = sb.exec("for i in $(seq 1 20000); do : > m$i || exit 3; done", cwd="/workspace")
            assert many.exit_code == 3 and "No space left on device" in many.stderr
            _run(sb, "rm -f fill m*")
        assert canary.read_text() == "host file\n"
        with Sandbox.create(url=gw.url, api_key=KEY_A, volume="small") as sb:
            assert _run(sb, "sha256sum before.bin").split()[0] == before
            assert _run(sb, "stat -c %a suid-id") == "4755\n"
        assert hashlib.sha256(canary.read_bytes()).hexdigest() == hashlib.sha256(b"host file\n").hexdigest()
        owner.delete_volume("small")
        assert not image.exists()
        assert "small" not in [v.name for v in owner.volumes()]


def _image_of(data_dir: Path, name: str) -> Path:
    records = [json.loads(p.read_text()) for p in (data_dir / "volumes" / "records").glob("vol_*.json")]
    (record,) = [r for r in records if r["name"] == name]
    return data_dir / "volumes" / "images" / f"{record['id']}.img"


def test_a_restarted_gateway_keeps_a_live_sessions_hold(tmp_path: Path, runtime: DockerHarness) -> None:
    """A gateway stopped with a session holding a volume (its sandbox runs on); the next one over the
    same data dir adopts the session and its hold, and releases it at the session's end."""
    instance = f"volumes-restart-{time.time_ns()}"
    try:
        with gateway(tmp_path, instance, egress=False, record=False) as first, Gateway(first.url, KEY_A) as owner:
            owner.create_volume("kept", 16)
            with first.client(KEY_A) as http:
                created = http.post("/v1/sessions", json={"volume": "kept"}).json()
        with gateway(tmp_path, instance, egress=False, record=False) as again, Gateway(again.url, KEY_A) as owner:
            assert owner.volume("kept").in_use_by == created["id"]
            with again.client(KEY_A) as http:
                action = {"type": "exec", "command": "echo hi > f && cat f", "cwd": "/workspace"}
                reply = http.post(f"/v1/sessions/{created['id']}/actions", json={"action": action}).json()
                assert reply["ok"] and reply["result"]["stdout"] == "hi\n"
                assert http.delete(f"/v1/sessions/{created['id']}").status_code == 204
            assert owner.volume("kept").in_use_by is None
            assert _loops_of(tmp_path / "volumes") == []
            owner.delete_volume("kept")
    finally:
        runtime.remove_all({GATEWAY_LABEL: instance})


@pytest.mark.usefixtures("egress_image")
def test_claim_and_release_are_records_of_the_sessions_audit_chain(tmp_path: Path, runtime: DockerHarness) -> None:
    """With egress control (the default gateway): the claim and the release, with their sizes, are
    records of the session's hash-chained audit log, beside the volume's own audit file."""
    instance = f"volumes-audit-{time.time_ns()}"
    try:
        with gateway(tmp_path, instance, record=False) as served, Gateway(served.url, KEY_A) as owner:
            owner.create_volume("audited", 16)
            with Sandbox.create(url=served.url, api_key=KEY_A, volume="audited") as sb:
                _run(sb, "head -c 65536 /dev/zero > f && sync")
                session_id = sb.id
            volume_records = traffic(served, session_id, event="volume")
            assert [(r["change"], r["volume"], r["size_mb"]) for r in volume_records] == [
                ("claimed", "audited", 16),
                ("released", "audited", 16),
            ]
            assert volume_records[1]["used_bytes"] >= volume_records[0]["used_bytes"] + 65536
            owner.delete_volume("audited")
    finally:
        runtime.remove_all({GATEWAY_LABEL: instance})
