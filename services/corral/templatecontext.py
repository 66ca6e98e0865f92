"""A template's build context packed on the client side (the CLI's and the SDK's): the template file
and a context directory as one tar for ``POST /v1/templates``. Files and directories only (a link is
refused, never followed), bounded in size; the gateway reads it without extracting it."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from corral.errors import InvalidRequest

TEMPLATE_FILE = "corral.template.yaml"
MAX_CONTEXT_BYTES = 64 << 20  # the gateway's default cap (CORRAL_TEMPLATE_CONTEXT_MAX_MB)


def _name_for(file: Path) -> str:
    """The template file's name in the context: a Dockerfile keeps ``Dockerfile``, anything else is the YAML."""
    return "Dockerfile" if file.name.lower().startswith("dockerfile") else TEMPLATE_FILE


def pack(file: Path, context: Path | None = None, limit: int = MAX_CONTEXT_BYTES) -> tuple[bytes, str]:
    """The tar and the template file's path in it. ``file`` inside ``context`` keeps its place; outside
    it (or without a context) it goes in at the top as ``corral.template.yaml`` or ``Dockerfile``."""
    out = io.BytesIO()
    total = 0
    inside: str | None = None
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        if context is not None:
            root = context.resolve()
            if not root.is_dir():
                raise InvalidRequest(f"{context} is not a directory", field="context")
            for directory, dirs, files in os.walk(root, followlinks=False):
                dirs.sort()
                for entry in sorted([*dirs, *files]):
                    path = Path(directory) / entry
                    name = path.relative_to(root).as_posix()
                    if path.is_symlink():
                        raise InvalidRequest(f"{name} is a link: a build context holds files and directories only")
                    total += path.stat().st_size if path.is_file() else 0
                    if total > limit:
                        raise InvalidRequest(f"the build context is over {limit >> 20} MiB", field="context")
                    archive.add(path, name, recursive=False)
                    if path.resolve() == file.resolve():
                        inside = name
        if inside is None:
            inside = _name_for(file)
            data = file.read_bytes()
            info = tarfile.TarInfo(inside)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue(), inside
