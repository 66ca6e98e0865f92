"""Files a service's task is given without a shared directory and without ``docker exec``: Swarm
secrets, one per file, each labelled with the service it belongs to (removed with it), mounted with
the owner and mode the reader needs. The controller's per-boot secret is kept by the gateway too,
in a 0700 directory of its own: Swarm never gives a secret's content back, and a restarted gateway
needs it to drive the sandboxes it finds."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.types

from corral.errors import SandboxError
from corral.runtime.swarm.engine import SwarmEngine

OWNER_LABEL = "corral.owner"  # a secret's service's name
MAX_SECRET_BYTES = 500 * 1024  # Swarm's own limit on a secret


@dataclass(frozen=True, slots=True)
class GivenFile:
    """One file for a task: where it appears inside, whose it is and its mode."""

    target: str
    data: bytes
    uid: int
    mode: int = 0o400


def secret_name(owner: str, target: str) -> str:
    """A secret's name: its service's, a fresh suffix (a name is never reused while an old one
    lingers), and the target's last part for whoever lists them."""
    tail = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in Path(target).name)[:40]
    return f"{owner}-{secrets.token_hex(4)}-{tail}"


class SwarmSecrets(SwarmEngine):
    """Secrets made for a service and removed with it."""

    def _give(self, owner: str, files: list[GivenFile]) -> list[docker.types.SecretReference]:
        """A secret per file; on any failure none is left."""
        refs = []
        try:
            for given in files:
                if len(given.data) > MAX_SECRET_BYTES:
                    raise SandboxError(
                        f"swarm driver: {given.target} is {len(given.data)} bytes; a Swarm secret holds at most "
                        f"{MAX_SECRET_BYTES}"
                    )
                name = secret_name(owner, given.target)
                created = self.client.api.create_secret(name, given.data, labels={OWNER_LABEL: owner})
                refs.append(
                    docker.types.SecretReference(
                        str(created["ID"]),
                        name,
                        filename=given.target,
                        uid=str(given.uid),
                        gid=str(given.uid),
                        mode=given.mode,
                    )
                )
        except docker.errors.APIError as exc:
            self._remove_secrets({OWNER_LABEL: owner})
            raise SandboxError(f"swarm driver: cannot make the secrets of {owner}: {exc.explanation or exc}") from None
        except SandboxError:
            self._remove_secrets({OWNER_LABEL: owner})
            raise
        return refs

    def _host_files(self, files: Mapping[str, str], uid: int) -> list[GivenFile]:
        """Host file -> path inside (``SandboxSpec.files``) read (bounded) into given files."""
        out = []
        for host, inside in files.items():
            try:
                with open(host, "rb") as handle:
                    data = handle.read(MAX_SECRET_BYTES + 1)
            except OSError as exc:
                raise SandboxError(f"swarm driver: cannot read {host} for the sandbox: {exc}") from None
            out.append(GivenFile(inside, data, uid))
        return out

    # -- the controller's secret, kept on the gateway's side ----------------------------------------------

    def _keep_secret(self, service: str, secret: str) -> None:
        directory = self._secrets_dir()
        if directory is None:
            return
        path = directory / service
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secret)

    def _kept_secret(self, service: str) -> str:
        directory = self._secrets_dir()
        if directory is None:
            return ""
        try:
            return (directory / service).read_text()[:256].strip()
        except OSError:
            return ""

    def _forget_secret(self, service: str) -> None:
        directory = self._secrets_dir()
        if directory is not None:
            (directory / service).unlink(missing_ok=True)

    def _secrets_dir(self) -> Path | None:
        if self.options.secrets_dir is None:
            return None
        self.options.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.options.secrets_dir
