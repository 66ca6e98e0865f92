"""A template's build context as the client sends it (a tar), read in memory and never extracted:
regular files and directories only, relative names without ``..``, bounded in count and size; and
the context the engine builds from, written anew (owners root, no setuid or setgid bit, the
Dockerfile the gateway generated). Pure."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass

from corral.errors import TemplateInvalid
from corral.gateway.templates.spec import TEMPLATE_FILE

MAX_MEMBERS = 10_000
MAX_BYTES = 64 << 20  # the files of a context together, unpacked (CORRAL_TEMPLATE_CONTEXT_MAX_MB's default)
GENERATED = ".corral-template"  # the gateway's own part of a context; a client's may not use the name


@dataclass(frozen=True, slots=True)
class Member:
    data: bytes
    mode: int  # permission bits only


@dataclass(frozen=True, slots=True)
class Context:
    """The client's context: its files by relative path, its directories, and which file is the template."""

    files: Mapping[str, Member]
    dirs: frozenset[str]
    template: str

    @property
    def template_text(self) -> bytes:
        return self.files[self.template].data

    def digest(self) -> str:
        """Its content, as the cache sees it: every file's path, mode and bytes, every directory."""
        total = hashlib.sha256()
        for path in sorted(self.files):
            member = self.files[path]
            total.update(json.dumps([path, member.mode, hashlib.sha256(member.data).hexdigest()]).encode())
        total.update(json.dumps(sorted(self.dirs)).encode())
        return total.hexdigest()

    def under(self, src: str) -> dict[str, Member]:
        """The files ``src`` names: the file itself, or every file under the directory."""
        if src in self.files:
            return {src: self.files[src]}
        prefix = src.rstrip("/") + "/"
        found = {path: member for path, member in self.files.items() if path.startswith(prefix)}
        if not found and src not in self.dirs:
            raise TemplateInvalid(f"{src} is not in the build context", field="files")
        return found


def _clean(name: str) -> str:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\0" in name:
        raise TemplateInvalid(f"{name!r}: a context's names are relative, without '..'", field="context")
    return "/".join(parts)


def read_context(upload: bytes, template: str | None = None, max_bytes: int = MAX_BYTES) -> Context:
    """The uploaded tar, read whole in memory: its files together at most ``max_bytes`` unpacked (a
    gzip's are any size: the route's cap is on the upload only). ``template`` is the template file's
    path in it (default ``corral.template.yaml``, else ``Dockerfile``)."""
    files: dict[str, Member] = {}
    dirs: set[str] = set()
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(upload), mode="r:*") as archive:
            for count, member in enumerate(archive, 1):
                if count > MAX_MEMBERS:
                    raise TemplateInvalid(f"a build context holds at most {MAX_MEMBERS} entries", field="context")
                name = _clean(member.name)
                if not name:
                    continue
                if name == GENERATED or name.startswith(GENERATED + "/"):
                    raise TemplateInvalid(f"{GENERATED} is the gateway's name in a context", field="context")
                if member.isdir():
                    dirs.add(name)
                elif member.isfile():
                    total += member.size  # the header's size, before a byte of it is read
                    if total > max_bytes:
                        raise TemplateInvalid(
                            f"a build context's files hold at most {max_bytes >> 20} MiB unpacked", field="context"
                        )
                    handle = archive.extractfile(member)
                    assert handle is not None  # a regular file always has its data
                    files[name] = Member(handle.read(), member.mode & 0o777)
                else:
                    raise TemplateInvalid(
                        f"{name}: links and special files are not taken in a build context", field="context"
                    )
    except tarfile.TarError as exc:
        raise TemplateInvalid(f"the build context is not a tar archive: {exc}", field="context") from None
    chosen = template or (TEMPLATE_FILE if TEMPLATE_FILE in files else "Dockerfile")
    chosen = _clean(chosen)
    if chosen not in files:
        raise TemplateInvalid(f"the build context holds no {chosen}", field="file")
    return Context(files, frozenset(dirs), chosen)


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode & 0o777, 0
    archive.addfile(info, io.BytesIO(data))


def write_context(dockerfile: str, files: Mapping[str, Member], extra: Mapping[str, bytes] | None = None) -> bytes:
    """The engine's context: ``Dockerfile``, ``files`` under their own names (modes cut to the
    permission bits, owners root), ``extra`` (the gateway's: wheels, npm's cache) under theirs."""
    # The engine builds an archive's last member of a name: a client's ``Dockerfile`` after the
    # generated one would be built instead of it, unchecked (any FROM, a stage copying any image).
    clash = sorted(name for name in (*files, *(extra or {})) if _clean(name) == "Dockerfile")
    if clash:
        raise TemplateInvalid(
            "a Dockerfile template's context holds no other file named Dockerfile (the gateway writes it)",
            field="context",
        )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        _add(archive, "Dockerfile", dockerfile.encode())
        for name, member in sorted(files.items()):
            _add(archive, name, member.data, member.mode)
        for name, data in sorted((extra or {}).items()):
            _add(archive, name, data)
    return out.getvalue()
