"""The Docker driver's ground: its names, labels and limits, the pure helpers every part shares
(sizes, names, uids, states), and :class:`Engine`, the docker client and the container look-ups
every part of :class:`~corral.runtime.docker.DockerRuntime` builds on."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any, get_args

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from corral.errors import SandboxError
from corral.runtime.types import (
    SandboxSpec,
    State,
)

log = logging.getLogger(__name__)

SANDBOX_LABEL = "corral.role"
SANDBOX_ROLE = "sandbox"
EGRESS_ROLE = "egress"
NETWORK_ROLE = "network"
CONTROLLER_PORT = 8765
EGRESS_STATE = "/var/lib/corral-egress"  # where the proxy keeps its CA, policy and audit log
EGRESS_UID = 1001  # the proxies' uid under a root gateway unless CORRAL_EGRESS_UID says otherwise
# Containers log to Docker's json-file driver: at most this much each, so a chatty or hostile
# sandbox cannot fill the host's disk through its logs.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}}
CONTROLLER_USER = "corral"  # the sandbox's controller uid; the only one that reads its secrets
CONTROLLER_UID = 1000
AGENT_UID = 1100  # the sandbox's agent uid: Chromium, and what the agent runs
SECRET_WAIT_S = 10.0  # boot writes the secret within its first tenth of a second
_REFUSED_EVERY_S = 0.02  # /healthz tried this often while the controller's port refuses
_NOT_READY_EVERY_S = 0.05  # ... and while it answers "not yet" (its screen or Chromium still starting)
_STATE_EVERY_S = 0.25  # ... and its container's state read this often
_INIT_LOGS = b"corral.init: "  # any line of the init's: boot, which writes the secret, has handed over

LineSink = Callable[[str], None]


# The agent's tmpfs mounts hold their files in the sandbox's memory, charged to its cgroup and freed by
# no OOM kill: filled, they would leave nothing for the controller, Chromium and X, which the kernel
# would then kill again and again. Together (with /dev/shm, Chromium's and the agent's alike) they get
# the session's memory less this headroom (at least MIN_HEADROOM_MIB, else a quarter of it); the sizes
# asked are cut in proportion when they do not fit (each at least MIN_TMPFS_MIB).
MIN_HEADROOM_MIB = 512
MIN_TMPFS_MIB = 16
AGENT_HOME_SIZE = "512m"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def mebibytes(size: str) -> int:
    """Docker's size text (``2g``, ``512m``, ``1024k``, bytes) in whole MiB."""
    text = size.strip().lower()
    unit = text[-1] if text and text[-1] in _UNITS else ""
    number = text[: len(text) - len(unit)] if unit else text
    if not number.isdigit():
        raise ValueError(f"not a size: {size!r}")
    return int(number) * _UNITS[unit] >> 20


def agent_tmpfs_mib(spec: SandboxSpec) -> dict[str, int]:
    """The size in MiB of each tmpfs the agent can write (``/dev/shm`` included): as ``spec`` asks when
    they fit the session's memory less its headroom, else cut in proportion (``/dev/shm`` first kept
    whole, since Chromium draws through it, up to half the room)."""
    memory = mebibytes(spec.memory)
    room = max(memory - max(MIN_HEADROOM_MIB, memory // 4), 4 * MIN_TMPFS_MIB)
    shm = max(MIN_TMPFS_MIB, min(mebibytes(spec.shm_size), room // 2, room - 3 * MIN_TMPFS_MIB))
    asked = {"/tmp": spec.tmp_size, "/home/agent": AGENT_HOME_SIZE, "/workspace": spec.workspace_size}
    if spec.workspace_mount is not None:  # a volume's disk, not the sandbox's memory
        del asked["/workspace"]
    wanted = {path: mebibytes(size) for path, size in asked.items()}
    left = room - shm
    total = sum(wanted.values())
    if total > left:  # each its floor, and what is left over in proportion
        spare = left - MIN_TMPFS_MIB * len(wanted)
        wanted = {path: MIN_TMPFS_MIB + size * spare // total for path, size in wanted.items()}
    return {**wanted, "/dev/shm": shm}


def session_network_name(session_id: str) -> str:
    return f"corral-net-{session_id}"


def proxy_name(session_id: str) -> str:
    return f"corral-egress-{session_id}"


def default_proxy_uid(setting: int | None, euid: int) -> int:
    """The host uid proxies run as: CORRAL_EGRESS_UID; unset, EGRESS_UID under a root gateway, else
    the gateway's own uid (only root can give a state directory to another user)."""
    if setting is not None:
        return setting
    return EGRESS_UID if euid == 0 else euid


def remapped_root(info: Mapping[str, Any]) -> int:
    """The host uid a container's root is under the engine's ``userns-remap`` (0 without it): the
    engine names its data root after the mapping it uses (``/var/lib/docker/100000.100000``)."""
    options = info.get("SecurityOptions") or []
    if not any(str(option).startswith("name=userns") for option in options):
        return 0
    uid, _, _gid = PurePath(str(info.get("DockerRootDir", ""))).name.partition(".")
    if not uid.isdigit():
        raise SandboxError(f"the engine remaps users but its data root names no mapping: {info.get('DockerRootDir')!r}")
    return int(uid)


def hand_over(root: Path, uid: int) -> None:
    """``root`` and everything in it to ``uid`` (and its group), links themselves rather than what
    they point at: what a container runs as must own what is mounted for it."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, subdirs, files in os.walk(root):
        for name in [*subdirs, *files]:
            os.chown(Path(directory) / name, uid, uid, follow_symlinks=False)


def container_state(status: str) -> State:
    known: tuple[State, ...] = get_args(State)
    for state in known:
        if state == status:
            return state
    return "dead"  # a state Docker does not have today: nothing that runs


def address_on(container: Container, network: str) -> str:
    """A container's address on one network ("" when it has none there)."""
    networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
    return str((networks.get(network) or {}).get("IPAddress") or "")


def bridge_interface(attrs: Mapping[str, Any]) -> str:
    """The host interface of a bridge network (what the host guard's rules name)."""
    options = attrs.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{str(attrs['Id'])[:12]}")


# Each start's secret is written in a directory of this prefix under the handover directory.
GIVEN_SECRET_PREFIX = "secret-"


def sweep_given_secrets(handover_dir: Path) -> list[str]:
    """Remove the secrets' directories a start left in ``handover_dir``: only a gateway killed between
    writing one and Docker's mount leaves any (its clean-up never ran), and they hold the controller
    secret of a sandbox that may still run. Called once, when the runtime is made: a gateway's data dir
    is its own, so no start is under way then. Returns what was removed."""
    try:
        entries = list(handover_dir.iterdir())
    except FileNotFoundError:
        return []
    removed: list[str] = []
    for entry in entries:
        if entry.name.startswith(GIVEN_SECRET_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    if removed:
        log.warning(
            "removed %d controller secret(s) a start before a restart left: %s", len(removed), ", ".join(removed)
        )
    return removed


class Engine:
    """The docker client (one per runtime), where a container's uid is on the host, and the look-ups
    of one container that every part shares."""

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        proxy_uid: int | None = None,
        shares_proxy_state: bool = True,
        handover_dir: Path | None = None,
    ) -> None:
        self.proxy_uid = default_proxy_uid(proxy_uid, os.geteuid())
        # Where a sandbox's controller secret is written for its start (the gateway's data dir, at the
        # same path for the engine): None, and the runtime reads the secret boot makes with an exec.
        self.handover_dir = handover_dir
        if handover_dir is not None:
            sweep_given_secrets(handover_dir)
        # False for tests only: each proxy keeps its state on a tmpfs of its own, seeded from the
        # gateway's directory as the swarm driver seeds it, and the gateway mirrors it back (the
        # swarm's way, on one host: tests/integration/test_unshared_state.py).
        self.shares_proxy_state = shares_proxy_state
        self._seeds: dict[str, Path] = {}  # session id -> its unshared proxy's seed directory
        try:
            self.client = client or docker.from_env()
            # What a container's uid is on the host: the same number, or shifted by userns-remap
            # (docs/userns.md); every file handed to a container's uid is chowned to that.
            self.host_root = remapped_root(self.client.info())
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot reach the Docker engine: {exc}") from None

    @property
    def architecture(self) -> str:
        arch: str = self.client.info().get("Architecture", "x86_64")
        return arch

    def _container(self, ident: str) -> Container:
        try:
            container: Container = self.client.containers.get(ident)
        except docker.errors.NotFound:
            raise SandboxError(f"no sandbox {ident}") from None
        return container

    def logs(self, ident: str, tail: int = 100) -> str:
        raw: bytes = self._container(ident).logs(tail=tail)
        return raw.decode(errors="replace")

    def remove(self, ident: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.client.containers.get(ident).remove(force=True)

    def read_file(self, ident: str, path: str) -> str | None:
        """A small text file inside a container, or None when it is not there."""
        try:
            code, out = self._container(ident).exec_run(["cat", path], user="root")
        except (SandboxError, docker.errors.APIError):
            return None
        return out.decode(errors="replace").strip() if code == 0 else None
