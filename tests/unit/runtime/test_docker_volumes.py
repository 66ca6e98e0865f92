"""The Docker driver's workspace volumes, the pure parts: the commands as argument lists, the
listings read bounded and by the rules, a volume's mount in place of the /workspace tmpfs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.runtime import SandboxSpec
from corral.runtime.docker import agent_tmpfs_mib, sandbox_options
from corral.runtime.docker.volumes import MOUNT_OPTIONS, mkfs_argv, mount_argv, parse_loops, parse_mounts, usage_of


def test_a_volume_replaces_the_workspace_tmpfs_with_a_read_write_bind() -> None:
    spec = SandboxSpec(memory="4g", workspace_mount="/data/volumes/mnt/vol_1")
    options = sandbox_options(spec)
    assert "/workspace" not in options["tmpfs"]
    assert options["volumes"]["/data/volumes/mnt/vol_1"] == {"bind": "/workspace", "mode": "rw"}
    assert "/workspace" not in agent_tmpfs_mib(spec)  # a disk's, not the session's memory
    plain = sandbox_options(SandboxSpec(memory="4g"))
    assert "/workspace" in plain["tmpfs"] and plain["volumes"] == {}


def test_the_commands_are_argument_lists_that_keep_the_agents_ownership() -> None:
    argv = mkfs_argv(Path("/d/vol_1.img"), 101100)
    assert argv[0] == "mkfs.ext4" and argv[-1] == "/d/vol_1.img"
    assert "root_owner=101100:101100" in argv[argv.index("-E") + 1] and argv[argv.index("-m") + 1] == "0"
    assert mount_argv("/dev/loop3", Path("/d/mnt/vol_1")) == [
        "mount", "-t", "ext4", "-o", MOUNT_OPTIONS, "/dev/loop3", "/d/mnt/vol_1",
    ]  # fmt: skip
    assert {"nosuid", "nodev"} <= set(MOUNT_OPTIONS.split(","))


def test_only_loop_devices_of_the_volumes_images_are_ours() -> None:
    images = Path("/data/volumes/images")
    listing = json.dumps(
        {
            "loopdevices": [
                {"name": "/dev/loop0", "back-file": "/data/volumes/images/vol_a.img"},
                {"name": "/dev/loop1", "back-file": "/data/volumes/images/vol_b.img (deleted)"},
                {"name": "/dev/loop2", "back-file": "/var/lib/snapd/snaps/core.snap"},
                {"name": "/dev/loop3", "back-file": "/data/volumes/images/sub/vol_c.img"},
                {"name": "/dev/loop4", "back-file": None},
                "nonsense",
            ]
        }
    )
    assert parse_loops(listing, images) == {
        "/dev/loop0": images / "vol_a.img",
        "/dev/loop1": images / "vol_b.img",
    }
    assert parse_loops("not json", images) == {} and parse_loops("", images) == {}


def test_mountinfo_is_read_by_source_with_its_escapes() -> None:
    info = (
        "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "52 25 7:3 / /data\\040dir/volumes/mnt/vol_a rw,nosuid,nodev shared:9 - ext4 /dev/loop3 rw\n"
        "short line\n"
    )
    assert parse_mounts(info) == {
        "/dev/root": Path("/mnt1"),
        "/dev/loop3": Path("/data dir/volumes/mnt/vol_a"),
    }


def test_usage_is_refused_where_nothing_is_mounted(tmp_path: Path) -> None:
    """An empty mountpoint's statfs would be the data dir's filesystem: never taken for the volume's."""
    with pytest.raises(FileNotFoundError):
        usage_of(tmp_path)
