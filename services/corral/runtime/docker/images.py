"""Images: building, importing and pulling them, and ``docker compose`` (the CLI: Compose has no SDK)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping
from pathlib import Path

import docker
import docker.errors
import docker.types

from corral.errors import ImageBuildError, SandboxError
from corral.runtime.docker.engine import (
    Engine,
    LineSink,
)

log = logging.getLogger(__name__)


class Images(Engine):
    """The images a runtime starts containers from."""

    def image_exists(self, name: str) -> bool:
        try:
            self.client.images.get(name)
        except docker.errors.ImageNotFound:
            return False
        return True

    def try_pull(self, name: str) -> bool:
        try:
            self.client.images.pull(name)
        except docker.errors.APIError:
            return False
        return True

    def import_rootfs(self, tarball: Path, repository: str, tag: str) -> None:
        try:
            self.client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import of {tarball} failed: {exc}") from None

    def build(self, context: Path, dockerfile: str, tag: str, buildargs: Mapping[str, str], sink: LineSink) -> None:
        """Build with the engine's builder, streaming its output lines to ``sink``."""
        stream = self.client.api.build(
            path=str(context), dockerfile=dockerfile, tag=tag, buildargs=dict(buildargs), rm=True, decode=True
        )
        for chunk in stream:
            if "error" in chunk:
                raise ImageBuildError(f"building {tag} failed: {chunk['error'].strip()}")
            text = chunk.get("stream") or chunk.get("status")
            if text and text.strip():
                sink(text.rstrip())

    def compose(self, project_dir: Path, args: list[str]) -> None:
        """Run ``docker compose`` in ``project_dir`` (the CLI, as Compose has no SDK)."""
        result = subprocess.run(
            ["docker", "compose", *args], cwd=project_dir, check=False, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise SandboxError(f"docker compose {' '.join(args)} failed:\n{result.stderr[-2000:]}")
