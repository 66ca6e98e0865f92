"""Workspace volumes on the host: one image file per volume with its own ext4 (its size is the
quota), attached to a loop device and mounted nosuid,nodev by the gateway, then bind-mounted into
the one sandbox that holds it (docs/design/0330-workspace-volumes.md).

Every command is an argument list with a bounded output. Nothing here opens, lists or follows
anything the sandbox wrote: usage is statfs of the mount, never a walk, and the only path ever
touched inside a filesystem is ``lost+found`` of one just made, before any sandbox saw it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import subprocess
import threading
from pathlib import Path

from corral.errors import SandboxError
from corral.runtime.docker.engine import AGENT_UID, Engine
from corral.runtime.types import VolumeMount, VolumeUsage

log = logging.getLogger(__name__)

LOOP_MAJOR = 7
LOOP_CTL_GET_FREE = 0x4C82  # linux/loop.h: the number of a free loop device (made if need be)
LOOP_CONTROL = Path("/dev/loop-control")
# nosuid, nodev: a setuid file or a device node the agent made is inert, on the host and inside.
# noinit_itable: the image's blocks are reserved unwritten, so read as zeros already; the kernel's
# background zeroing would only write them for nothing.
MOUNT_OPTIONS = "nosuid,nodev,noatime,noinit_itable"
_COMMAND_TIMEOUT_S = 60.0
_OUTPUT_CAP = 1 << 20  # bytes of a listing read at most
_ATTACH_TRIES = 4  # another process on the host may take the free loop device between asking and attaching


def mkfs_argv(image: Path, owner: int) -> list[str]:
    """mke2fs for a volume: its root owned by ``owner`` (the agent's uid as the host sees it), no
    blocks reserved for root (the agent never is), nothing discarded (the reservation stays)."""
    extended = f"root_owner={owner}:{owner},nodiscard,lazy_itable_init=1,lazy_journal_init=1"
    return ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "corral-volume", "-E", extended, str(image)]


def losetup_argv(device: str, image: Path) -> list[str]:
    return ["losetup", device, str(image)]


def mount_argv(device: str, mountpoint: Path) -> list[str]:
    return ["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, device, str(mountpoint)]


def parse_loops(listing: str, images: Path) -> dict[str, Path]:
    """``losetup --list --json``'s devices whose backing file is under ``images``: device -> file.
    Pure; a listing it cannot read is no devices (the caller logs it)."""
    try:
        devices = json.loads(listing or '{"loopdevices": []}').get("loopdevices") or []
    except (ValueError, AttributeError):
        return {}
    found: dict[str, Path] = {}
    for entry in devices:
        if not isinstance(entry, dict):
            continue
        name, back = entry.get("name"), entry.get("back-file")
        if isinstance(name, str) and isinstance(back, str):
            path = Path(back.removesuffix(" (deleted)"))
            if path.parent == images:
                found[name] = path
    return found


def parse_mounts(mountinfo: str) -> dict[str, Path]:
    """/proc/self/mountinfo's mounts by their source device: device -> mountpoint. Pure."""
    mounts: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 10:
            continue
        after = fields[fields.index("-") + 1 :]
        if len(after) >= 2:
            mounts[_unescape(after[1])] = Path(_unescape(fields[4]))
    return mounts


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (a space is ``\\040``)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _run(argv: list[str]) -> str:
    """A command's output; SandboxError with its own words when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        said = done.stderr[:2000].decode(errors="replace").strip()
        raise SandboxError(f"{' '.join(argv[:2])} failed ({done.returncode}): {said}")
    return done.stdout[:_OUTPUT_CAP].decode(errors="replace")


def usage_of(mountpoint: Path) -> VolumeUsage:
    """statfs of a mounted volume; OSError when nothing is mounted there (its directory's own figures
    would be the data dir's filesystem's)."""
    if not os.path.ismount(mountpoint):
        raise FileNotFoundError(f"no volume is mounted at {mountpoint}")
    st = os.statvfs(mountpoint)
    return VolumeUsage(
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        total_bytes=st.f_blocks * st.f_frsize,
        used_inodes=st.f_files - st.f_ffree,
        total_inodes=st.f_files,
    )


def free_loop_device() -> str:
    """A free loop device's path, its node made when this mount namespace has none (a gateway in a
    container sees only the /dev it started with; the kernel makes new devices in the host's)."""
    fd = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    try:
        number = fcntl.ioctl(fd, LOOP_CTL_GET_FREE)
    finally:
        os.close(fd)
    device = f"/dev/loop{number}"
    if not os.path.exists(device):
        os.mknod(device, stat.S_IFBLK | 0o660, os.makedev(LOOP_MAJOR, number))
    return device


class Volumes(Engine):
    """The volume images' host side: made, attached and mounted, detached, measured."""

    _attaching = threading.Lock()  # one attach at a time: each asks for the free device, then takes it

    def make_volume(self, image: Path, size_mb: int) -> VolumeUsage:
        image.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size_mb << 20)  # reserved: a full host disk never shows as EIO inside
            finally:
                os.close(fd)
            _run(mkfs_argv(image, self.host_root + AGENT_UID))
            mountpoint = image.with_suffix(".new")
            mount = self.attach_volume(image, mountpoint)
            try:
                # Made with the filesystem and nobody's yet: the agent cannot remove root's directory,
                # and a workspace shows what its owner put there only.
                (mountpoint / "lost+found").rmdir()
                return usage_of(mountpoint)
            finally:
                self.detach_volume(mount)
                mountpoint.rmdir()
        except BaseException:
            image.unlink(missing_ok=True)
            raise

    def attach_volume(self, image: Path, mountpoint: Path) -> VolumeMount:
        mountpoint.mkdir(mode=0o700, exist_ok=True)
        device = self._attach_loop(image)
        try:
            _run(mount_argv(device, mountpoint))
        except BaseException:
            with contextlib.suppress(SandboxError):
                _run(["losetup", "-d", device])
            raise
        return VolumeMount(image, device, mountpoint)

    def _attach_loop(self, image: Path) -> str:
        with self._attaching:
            for attempt in range(_ATTACH_TRIES):
                try:
                    device = free_loop_device()
                    _run(losetup_argv(device, image))
                    return device
                except OSError as exc:
                    raise SandboxError(f"no loop device for a volume: {exc}") from None
                except SandboxError:
                    if attempt == _ATTACH_TRIES - 1:
                        raise
                    log.info("loop device taken by another process meanwhile; asking again")
        raise AssertionError("unreachable")

    def detach_volume(self, mount: VolumeMount) -> None:
        mounted = parse_mounts(Path("/proc/self/mountinfo").read_text())
        if mount.mountpoint is not None and mounted.get(mount.device) == mount.mountpoint:
            _run(["umount", str(mount.mountpoint)])
        if mount.device in self._loops(mount.image.parent):
            _run(["losetup", "-d", mount.device])

    def volume_usage(self, mountpoint: Path) -> VolumeUsage:
        return usage_of(mountpoint)

    def attached_volumes(self, images: Path) -> list[VolumeMount]:
        mounted = parse_mounts(Path("/proc/self/mountinfo").read_text())
        return [VolumeMount(image, device, mounted.get(device)) for device, image in self._loops(images).items()]

    @staticmethod
    def _loops(images: Path) -> dict[str, Path]:
        try:
            listing = _run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"])
        except SandboxError as exc:
            log.warning("cannot list loop devices: %s", exc)
            return {}
        return parse_loops(listing, images)
