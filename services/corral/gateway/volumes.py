"""Workspace volumes: named per API key, each an image with a filesystem of its own (its size is
its quota) that one session at a time holds, mounted at its sandbox's /workspace.

The gateway keeps one record per volume in its data dir (``volumes/records``) with its holder: a
session id, or a claim's token while its session is being created. A hold lasts until the session's
end releases it (after the sandbox is removed: unmounted, detached), so a paused session keeps its
volume (:meth:`Volumes.suspend` and :meth:`Volumes.resume` free and take back the mount meanwhile).
A restarted gateway keeps the holds of the sessions it adopted and detaches everything else
(:meth:`Volumes.recover`). Each create, claim, release and delete is an audit record with sizes
(``volumes/audit/<id>.jsonl``, bounded) and a line of the gateway's log. Image, loop device and
mount are the runtime's (:class:`~corral.runtime.SandboxRuntime`); nothing here reads the volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from corral.contracts.control import VolumeEvent
from corral.errors import InvalidRequest, TooManyVolumes, VolumeExists, VolumeInUse, VolumeNotFound
from corral.gateway.models import VolumeOut
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import private_dir, write_json
from corral.runtime import SandboxRuntime, VolumeMount

log = logging.getLogger(__name__)

AUDIT_MAX_BYTES = 256 << 10  # a volume's audit file, past which its older half goes
CLAIM_PREFIX = "claim_"  # a holder that is a claim whose session is still being made


async def announce(events: list[VolumeEvent], report: Callable[[VolumeEvent], Awaitable[None]]) -> None:
    """Each event into the session's egress audit chain (``report``: its proxy's channel). A proxy
    that does not take one holds up neither the create nor the end: the volume's own audit file
    has the record already, and the gateway's log says what the chain lacks."""
    for event in events:
        try:
            await report(event)
        except Exception as exc:
            log.error("volume %s %s: not in the session's audit chain: %s", event.volume, event.change, exc)


class VolumeRecord(BaseModel):
    """What the gateway keeps of one volume (``records/<id>.json``). Frozen: a change replaces it."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    id: str
    owner: str  # the API key's id
    name: str
    size_mb: int
    created_at: float
    used_bytes: int = 0  # as statfs said when its last holder let go (or when made)
    holder: str | None = None
    device: str | None = None  # its loop device while attached


@dataclass(frozen=True, slots=True)
class VolumeLimits:
    default_mb: int
    max_mb: int
    per_key: int

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> VolumeLimits:
        return cls(settings.volume_default_mb, settings.volume_max_mb, settings.max_volumes_per_key)


@dataclass(frozen=True, slots=True)
class Claim:
    """A volume taken for a session being made: its holder token and the host mount to hand over."""

    token: str
    volume: str
    mountpoint: Path


class Volumes:
    def __init__(self, root: Path, runtime: SandboxRuntime, limits: VolumeLimits) -> None:
        self._runtime, self._limits = runtime, limits
        self._records_dir = private_dir(root / "records")
        self.images = private_dir(root / "images")
        self._mounts = private_dir(root / "mnt")
        self._audit = private_dir(root / "audit")
        self._records = {r.id: r for r in self._load()}
        # Held through each change, runtime calls included (each well under a second): a claim never
        # sees a volume half made, half deleted or half released.
        self._lock = asyncio.Lock()

    # -- what the API asks -----------------------------------------------------------------------------

    async def create(self, owner: str, name: str, size_mb: int | None) -> VolumeOut:
        size = size_mb or self._limits.default_mb
        if size > self._limits.max_mb:
            raise InvalidRequest(f"size_mb is at most {self._limits.max_mb}", field="size_mb")
        async with self._lock:
            mine = [r for r in self._records.values() if r.owner == owner]
            if any(r.name == name for r in mine):
                raise VolumeExists(f"volume {name!r} exists already")
            if len(mine) >= self._limits.per_key:
                raise TooManyVolumes(f"this API key has {len(mine)} volumes, its limit ({self._limits.per_key})")
            record = VolumeRecord(
                id="vol_" + secrets.token_hex(8), owner=owner, name=name, size_mb=size, created_at=time.time()
            )
            started = time.monotonic()
            usage = await asyncio.to_thread(self._runtime.make_volume, self._image(record), size)
            record = self._keep(record.model_copy(update={"used_bytes": usage.used_bytes}))
            self._note(record, "create", seconds=round(time.monotonic() - started, 3))
        return self._out(record, record.used_bytes)

    async def owned(self, owner: str) -> list[VolumeOut]:
        mine = sorted((r for r in self._records.values() if r.owner == owner), key=lambda r: r.created_at)
        return [self._out(r, await self._used(r)) for r in mine]

    async def get(self, owner: str, name: str) -> VolumeOut:
        record = self._find(owner, name)
        return self._out(record, await self._used(record))

    async def delete(self, owner: str, name: str) -> None:
        async with self._lock:
            record = self._find(owner, name)
            if record.holder is not None:
                raise VolumeInUse(f"volume {name!r} is held by session {self._shown(record.holder)}")
            await asyncio.to_thread(self._image(record).unlink, missing_ok=True)
            (self._records_dir / f"{record.id}.json").unlink(missing_ok=True)
            del self._records[record.id]
            self._note(record, "delete")
            (self._audit / f"{record.id}.jsonl").unlink(missing_ok=True)

    # -- what sessions do ------------------------------------------------------------------------------

    async def claim(self, owner: str, name: str) -> Claim:
        """The volume taken for a session being made, and mounted; VolumeNotFound (not this key's, or
        none), VolumeInUse (another session holds it)."""
        async with self._lock:
            record = self._find(owner, name)
            if record.holder is not None:
                raise VolumeInUse(f"volume {name!r} is held by session {self._shown(record.holder)}")
            token = CLAIM_PREFIX + secrets.token_hex(8)
            mount = await self._attach(record)
            self._keep(record.model_copy(update={"holder": token, "device": mount.device}))
            return Claim(token, record.id, self._mountpoint(record))

    async def bind(self, claim: Claim, session_id: str) -> VolumeEvent:
        """The claim's session is made: it holds the volume from now until its end. Returns the
        claim's record for the session's own audit chain."""
        async with self._lock:
            record = self._keep(self._records[claim.volume].model_copy(update={"holder": session_id}))
            used = await self._used(record)
            self._note(record, "claim", session=session_id, used_bytes=used)
            return VolumeEvent("claimed", record.name, record.size_mb, used)

    async def release(self, holder: str) -> list[VolumeEvent]:
        """Whatever ``holder`` (a session id or a claim's token) holds: unmounted, detached, let go.
        Call it after the sandbox using it is removed. Returns the releases' records for the
        session's audit chain."""
        events = []
        async with self._lock:
            for record in [r for r in self._records.values() if r.holder == holder]:
                used = await self._detach(record)
                record = self._keep(record.model_copy(update={"holder": None, "device": None, "used_bytes": used}))
                if not holder.startswith(CLAIM_PREFIX):
                    self._note(record, "release", session=holder, used_bytes=used)
                    events.append(VolumeEvent("released", record.name, record.size_mb, used))
        return events

    async def suspend(self, holder: str) -> None:
        """Unmounted and detached, the hold kept (a paused session whose sandbox is gone meanwhile)."""
        async with self._lock:
            for record in [r for r in self._records.values() if r.holder == holder and r.device]:
                used = await self._detach(record)
                self._keep(record.model_copy(update={"device": None, "used_bytes": used}))

    async def resume(self, holder: str) -> Path | None:
        """The mount of the volume ``holder`` holds, attached again if suspended; None if it holds none."""
        async with self._lock:
            for record in [r for r in self._records.values() if r.holder == holder]:
                if record.device is None:
                    mount = await self._attach(record)
                    self._keep(record.model_copy(update={"device": mount.device}))
                return self._mountpoint(record)
        return None

    async def recover(self, live: set[str]) -> None:
        """At a gateway's start: the holds of ``live`` sessions kept, every other hold released, every
        attached image nobody holds detached, images no record names (a crash mid-create) removed."""
        for record in list(self._records.values()):
            if record.holder is not None and record.holder not in live:
                log.info("volume %s: its holder %s is gone; released", record.id, record.holder)
                await self.release(record.holder)
        held = {r.id for r in self._records.values() if r.holder is not None}
        for mount in await asyncio.to_thread(self._runtime.attached_volumes, self.images):
            if mount.image.stem not in held:
                log.info("detaching volume image %s (%s): no session holds it", mount.image.name, mount.device)
                await asyncio.to_thread(self._runtime.detach_volume, mount)
        for image in self.images.iterdir():
            if image.stem not in self._records:
                log.info("removing volume image %s: no record names it", image.name)
                image.unlink(missing_ok=True)

    def held_by(self, holder: str) -> str | None:
        """The name of the volume ``holder`` holds, if any."""
        return next((r.name for r in self._records.values() if r.holder == holder), None)

    # -- inside ----------------------------------------------------------------------------------------

    def _find(self, owner: str, name: str) -> VolumeRecord:
        for record in self._records.values():
            if record.owner == owner and record.name == name:
                return record
        raise VolumeNotFound(f"no volume {name!r}")

    @staticmethod
    def _shown(holder: str) -> str:
        return "being created" if holder.startswith(CLAIM_PREFIX) else holder

    def _image(self, record: VolumeRecord) -> Path:
        return self.images / f"{record.id}.img"

    def _mountpoint(self, record: VolumeRecord) -> Path:
        return self._mounts / record.id

    async def _attach(self, record: VolumeRecord) -> VolumeMount:
        return await asyncio.to_thread(self._runtime.attach_volume, self._image(record), self._mountpoint(record))

    async def _detach(self, record: VolumeRecord) -> int:
        """Unmounted and detached; returns its used bytes as statfs said just before."""
        used = await self._used(record)
        if record.device is not None:
            mount = VolumeMount(self._image(record), record.device, self._mountpoint(record))
            await asyncio.to_thread(self._runtime.detach_volume, mount)
        with contextlib.suppress(OSError):  # gone already, or still mounted where a crash left it
            self._mountpoint(record).rmdir()
        return used

    async def _used(self, record: VolumeRecord) -> int:
        if record.device is None:
            return record.used_bytes
        try:
            usage = await asyncio.to_thread(self._runtime.volume_usage, self._mountpoint(record))
        except OSError:
            return record.used_bytes
        return usage.used_bytes

    def _out(self, record: VolumeRecord, used: int) -> VolumeOut:
        holder = record.holder if record.holder and not record.holder.startswith(CLAIM_PREFIX) else None
        in_use = holder or ("starting" if record.holder else None)
        return VolumeOut(
            name=record.name, size_mb=record.size_mb, used_bytes=used, in_use_by=in_use, created_at=record.created_at
        )

    def _keep(self, record: VolumeRecord) -> VolumeRecord:
        write_json(self._records_dir / f"{record.id}.json", record.model_dump(mode="json"))
        self._records[record.id] = record
        return record

    def _load(self) -> list[VolumeRecord]:
        records = []
        for path in sorted(self._records_dir.glob("vol_*.json")):
            try:
                records.append(VolumeRecord.model_validate_json(path.read_bytes()))
            except (OSError, ValueError) as exc:
                log.error("volume record %s is unreadable, left as it is: %s", path.name, exc)
        return records

    def _note(self, record: VolumeRecord, event: str, **fields: object) -> None:
        """One audit record: the event, the volume, its sizes; never what it holds."""
        entry = {"at": time.time(), "event": event, "volume": record.name, "size_mb": record.size_mb, **fields}
        log.info("volume %s (%s) of %s: %s", record.name, record.id, record.owner, json.dumps(entry))
        path = self._audit / f"{record.id}.jsonl"
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")
        if path.stat().st_size > AUDIT_MAX_BYTES:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            path.write_text("".join(lines[len(lines) // 2 :]), encoding="utf-8")

    def audit(self, owner: str, name: str) -> list[dict[str, object]]:
        """A volume's audit records, oldest first."""
        path = self._audit / f"{self._find(owner, name).id}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
