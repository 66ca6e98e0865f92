"""What the swarm driver does not do, refused with an error that names it: workspace volumes (a
single host's loop devices), template builds and the reads of an image's files (the manager's image
store is not the nodes'), a browser state's export and import (``docker exec`` into a task on
another node), a proxy kept stopped (pausing). docs/swarm.md lists them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import docker.errors

from corral.errors import NotOnThisRuntime, SandboxError
from corral.runtime.swarm.engine import SwarmEngine
from corral.runtime.types import DirectoryEntry, ImageInfo, VolumeMount, VolumeUsage


def refuse(what: str) -> NoReturn:
    raise NotOnThisRuntime(f"{what}: not on the swarm driver (CORRAL_RUNTIME=swarm); see docs/swarm.md")


class SwarmRefusals(SwarmEngine):
    """The Protocol's single-host operations, each refused by name (no silent no-op)."""

    # -- workspace volumes -------------------------------------------------------------------------------

    def make_volume(self, image: Path, size_mb: int) -> VolumeUsage:
        refuse("workspace volumes")

    def attach_volume(self, image: Path, mountpoint: Path) -> VolumeMount:
        refuse("workspace volumes")

    def detach_volume(self, mount: VolumeMount) -> None:
        refuse("workspace volumes")

    def volume_usage(self, mountpoint: Path) -> VolumeUsage:
        refuse("workspace volumes")

    def attached_volumes(self, images: Path) -> list[VolumeMount]:
        return []  # none is ever attached here: a restarted gateway finds nothing to release

    # -- the browser's state -----------------------------------------------------------------------------

    def export_browser_state(self, ident: str, max_bytes: int, timeout_s: float = 60.0) -> bytes:
        refuse("a browser state's export")

    def import_browser_state(self, ident: str, archive: bytes, max_bytes: int, timeout_s: float = 60.0) -> int:
        refuse("a browser state's import")

    # -- template images ---------------------------------------------------------------------------------

    def build_image(
        self,
        context: bytes,
        tag: str,
        labels: Mapping[str, str],
        sink: Callable[[str], None],
        base_id: str,
        network: str,
    ) -> str:
        refuse("template builds")

    def image_info(self, name: str) -> ImageInfo | None:
        """The image as the manager's engine has it (None: not there; the nodes pull from the registry)."""
        try:
            attrs = self.client.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise SandboxError(f"swarm driver: cannot inspect image {name}: {exc.explanation or exc}") from None
        config = attrs.get("Config") or {}
        health = (config.get("Healthcheck") or {}).get("Test")
        return ImageInfo(
            id=str(attrs["Id"]),
            layers=tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
            entrypoint=tuple(config["Entrypoint"]) if config.get("Entrypoint") else None,
            cmd=tuple(config["Cmd"]) if config.get("Cmd") else None,
            user=str(config.get("User") or ""),
            healthcheck=tuple(health) if health else None,
            env=tuple(config.get("Env") or ()),
            volumes=tuple(config.get("Volumes") or ()),
            labels=dict(config.get("Labels") or {}),
            size=int(attrs.get("Size") or 0),
        )

    def tag_image(self, image_id: str, reference: str) -> None:
        refuse("template images")

    def remove_image(self, reference: str) -> None:
        refuse("template images")

    def forget_images(self, images: Sequence[str], keep: str = "") -> None:
        refuse("template images")

    def path_digests(self, image: str, paths: Sequence[str]) -> dict[str, str]:
        refuse("template checks")

    def read_files(self, image: str, paths: Sequence[str], limit: int) -> dict[str, bytes | None]:
        refuse("template checks")

    def setuid_files(self, image: str) -> list[str]:
        refuse("template checks")

    def link_targets(self, image: str, paths: Sequence[str]) -> dict[str, str | None]:
        refuse("template checks")

    def directory_entries(
        self, image: str, directory: str, digested: Collection[str] | None = None
    ) -> dict[str, DirectoryEntry]:
        refuse("template checks")

    def path_entries(self, image: str, paths: Sequence[str]) -> dict[str, DirectoryEntry | None]:
        refuse("template checks")
