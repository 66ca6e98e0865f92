"""The templates the gateway built: one JSON record per name in its data dir (``templates/``, which
no sandbox mounts), each version's image id as the check passed it (what a start believes, and
nothing else), the key that built it, its cache key, its environment. Names are gateway-wide (one
engine); any key lists and uses them, only the builder's key rebuilds or deletes one: to another,
it is absent."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.errors import TemplateNotFound
from corral.gateway.store import private_dir, write_private
from corral.gateway.templates.spec import TemplateRef, check_name

REPOSITORY = "corral-template"  # images are corral-template/NAME:N, the newest also corral-template/NAME:latest
MAX_RECORD_BYTES = 1 << 20


def image_reference(name: str, version: int | None = None) -> str:
    return f"{REPOSITORY}/{name}:{version if version is not None else 'latest'}"


class TemplateVersion(BaseModel):
    """One build of a template that passed the check."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int
    image_id: str  # the checked image: a start refuses any other under the name
    base_id: str  # the base it was built on
    cache_key: str  # the template file, its context and the base: the same again gives this version back
    env: dict[str, str] = Field(default_factory=dict)  # for its commands (the image's file holds the same)
    size: int = 0
    created_at: float


class TemplateRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    owner: str  # the key id that built it
    versions: list[TemplateVersion]
    last: int = 0  # the highest version number given: a deleted one is never given again

    @property
    def latest(self) -> TemplateVersion:
        return self.versions[-1]

    def version(self, number: int | None) -> TemplateVersion | None:
        if number is None:
            return self.latest if self.versions else None
        return next((v for v in self.versions if v.version == number), None)


class TemplateCatalog:
    """The records, read and written whole (atomic, 0600 in a 0700 directory)."""

    def __init__(self, data_dir: Path) -> None:
        self._root = data_dir / "templates"

    def _path(self, name: str) -> Path:
        return self._root / f"{check_name(name)}.json"

    def get(self, name: str) -> TemplateRecord | None:
        path = self._path(name)
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return None
        try:
            return TemplateRecord.model_validate_json(raw[:MAX_RECORD_BYTES])
        except ValidationError:
            return None  # a record cut short or hand-edited is no template

    def all(self) -> list[TemplateRecord]:
        if not self._root.is_dir():
            return []
        found = (self.get(path.stem) for path in sorted(self._root.glob("*.json")) if not path.name.startswith("."))
        return [record for record in found if record is not None and record.versions]

    def resolve(self, ref: TemplateRef) -> tuple[TemplateRecord, TemplateVersion]:
        """The version ``ref`` names (any key may use any template), or TemplateNotFound naming it."""
        record = self.get(ref.name)
        version = record.version(ref.version) if record is not None else None
        if record is None or version is None:
            raise TemplateNotFound(f"no template {ref}")
        return record, version

    def owned(self, name: str, owner: str) -> TemplateRecord | None:
        """The record if ``owner`` built it; None if there is none. Another key's: TemplateNotFound (as if absent)."""
        record = self.get(name)
        if record is not None and record.owner != owner:
            raise TemplateNotFound(f"no template {name}")
        return record

    def add(self, name: str, owner: str, version: TemplateVersion) -> TemplateRecord:
        record = self.get(name)
        versions = [*(record.versions if record is not None else []), version]
        last = max(record.last if record is not None else 0, version.version)
        updated = TemplateRecord(name=name, owner=owner, versions=versions, last=last)
        self.save(updated)
        return updated

    def save(self, record: TemplateRecord) -> None:
        private_dir(self._root)
        write_private(self._path(record.name), json.dumps(record.model_dump(mode="json")).encode())

    def drop(self, name: str, number: int | None) -> TemplateRecord | None:
        """Without version ``number`` (all of them: None); what is left, or None when nothing is."""
        record = self.get(name)
        if record is None:
            return None
        left = [v for v in record.versions if number is not None and v.version != number]
        if not left:
            self._path(name).unlink(missing_ok=True)
            return None
        kept = TemplateRecord(name=record.name, owner=record.owner, versions=left, last=record.last)
        self.save(kept)
        return kept

    def next_version(self, name: str) -> int:
        record = self.get(name)
        return max([record.last, *(v.version for v in record.versions)]) + 1 if record is not None else 1


def now() -> float:
    return time.time()
