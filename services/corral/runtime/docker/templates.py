"""Template images: built from a context the gateway assembled (a tar in memory, the classic builder,
no BuildKit frontend to fetch), inspected, tagged, removed; and the two looks the gateway's check
takes at a built one: digests of paths read through the engine's archive API (the daemon reads the
layers: nothing of the image runs) and the setuid and setgid files a check container finds."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import posixpath
import re
import secrets
import tarfile
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import docker.errors
from docker.constants import DEFAULT_DATA_CHUNK_SIZE

from corral.errors import SandboxError, TemplateBuildFailed
from corral.runtime.docker.engine import LOG_CONFIG, Engine, LineSink
from corral.runtime.types import DirectoryEntry, ImageInfo

log = logging.getLogger(__name__)

OUTPUT_LINES = 40  # of a failed step's output, kept for its error
MAX_DIGEST_BYTES = 2 << 30  # read of one path through the archive API, at most
CHECK_TIMEOUT_S = 120
MAX_CHECK_OUTPUT = 1 << 20
CHECK_LABELS = {"corral.role": "check"}


def _check_name() -> str:
    return f"corral-template-check-{secrets.token_hex(4)}"


_STEP = re.compile(r"^Step \d+/\d+ : ")
_MADE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
ABSENT = "absent"


def _tuple(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(str(part) for part in value)


def image_info(attrs: Mapping[str, Any]) -> ImageInfo:
    """An image's inspect answer, read into what the check compares (pure)."""
    config = attrs.get("Config") or {}
    health = config.get("Healthcheck") or {}
    return ImageInfo(
        id=str(attrs["Id"]),
        layers=tuple(str(layer) for layer in (attrs.get("RootFS") or {}).get("Layers") or ()),
        entrypoint=_tuple(config.get("Entrypoint")),
        cmd=_tuple(config.get("Cmd")),
        user=str(config.get("User") or ""),
        healthcheck=_tuple(health.get("Test")),
        env=tuple(str(entry) for entry in config.get("Env") or ()),
        volumes=tuple(sorted(config.get("Volumes") or {})),
        labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
        size=int(attrs.get("Size") or 0),
    )


class _BuildLog:
    """The classic builder's stream read as it comes: the step running, its last lines, the images
    each finished step made (removed if the build fails: a failed build leaves nothing)."""

    def __init__(self, sink: LineSink, base_id: str) -> None:
        self.sink, self.base = sink, base_id
        self.step = ""
        self.lines: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.made: list[str] = []

    def take(self, chunk: Mapping[str, Any]) -> str | None:
        """Reads one chunk; returns the builder's error, if this chunk is one."""
        if "error" in chunk:
            return str(chunk.get("error") or "").strip()
        image = (chunk.get("aux") or {}).get("ID") if isinstance(chunk.get("aux"), dict) else None
        if image:
            self.made.append(str(image))
        for raw in str(chunk.get("stream") or "").splitlines():
            line = raw.rstrip()
            if not line.strip():
                continue
            if _STEP.match(line):
                self.step, self.lines = line, deque(maxlen=OUTPUT_LINES)
            else:
                made = _MADE.match(line)
                if made and not self.step.startswith("Step 1/"):
                    self.made.append(made.group(1))
                self.lines.append(line)
            self.sink(line)
        return None


class TemplateImages(Engine):
    """Template images: build, inspect, tag, remove; and what the check reads of one."""

    def build_image(
        self, context: bytes, tag: str, labels: Mapping[str, str], sink: LineSink, base_id: str, network: str
    ) -> str:
        """Built from ``context`` (a tar holding ``Dockerfile``) and tagged ``tag``; its id. A build that
        fails removes the images its steps made (never ``base_id``, never one another image stands on)
        and raises :class:`TemplateBuildFailed` with the step and its output's end."""
        reading = _BuildLog(sink, base_id)
        failure: str | None = None
        try:
            stream = self.client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                labels=dict(labels),
                rm=True,
                forcerm=True,
                pull=False,
                # A network of Corral's (guarded, inter-container traffic off), never the engine's default
                # bridge: a template's RUN steps are its author's code.
                network_mode=network,
                decode=True,
            )
            for chunk in stream:
                failure = reading.take(chunk) or failure
        except docker.errors.APIError as exc:
            failure = str(exc.explanation or exc)
        if failure is None:
            try:
                return str(self.client.images.get(tag).id)
            except docker.errors.ImageNotFound:
                failure = "the builder ended without an image"
        self.forget_images(reading.made, keep=base_id)
        output = "\n".join(reading.lines)
        step = reading.step or "the build"
        raise TemplateBuildFailed(f"{step}: {failure}", step=step, output=output)

    def forget_images(self, images: Sequence[str], keep: str = "") -> None:
        """Remove ``images`` (newest first), none forced: one that is tagged elsewhere or that another
        image stands on stays."""
        for image in reversed(images):
            if keep and (keep.removeprefix("sha256:").startswith(image) or image == keep):
                continue
            with contextlib.suppress(docker.errors.APIError):
                self.client.images.remove(image, force=False, noprune=False)

    def image_info(self, name: str) -> ImageInfo | None:
        try:
            return image_info(self.client.api.inspect_image(name))
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot inspect image {name}: {exc}") from None

    def tag_image(self, image_id: str, reference: str) -> None:
        repository, _, tag = reference.rpartition(":")
        self.client.api.tag(image_id, repository, tag)

    def remove_image(self, reference: str) -> None:
        """Untag ``reference`` (and remove its image once nothing else names it); nothing if absent."""
        try:
            self.client.images.remove(reference, force=False, noprune=False)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise SandboxError(f"cannot remove image {reference}: {exc.explanation or exc}") from None
            # A sandbox still runs from it ("container ... is using its referenced image"): the name goes
            # now (forced: the engine only untags an image a running container uses), the image stays.
            with contextlib.suppress(docker.errors.ImageNotFound):
                self.client.images.remove(reference, force=True, noprune=False)

    @contextlib.contextmanager
    def _unstarted(self, image: str) -> Iterator[str]:
        """A container of ``image`` made but never started (no network, an entrypoint that is not
        there): what the check reads files of through the archive API; removed after."""
        container = self.client.containers.create(
            image,
            entrypoint=["/nonexistent"],
            network_mode="none",
            log_config=LOG_CONFIG,
            labels=CHECK_LABELS,
            name=_check_name(),
        )
        try:
            yield str(container.id)
        finally:
            container.remove(force=True)

    @contextlib.contextmanager
    def _archive(self, ident: str, path: str, chunk: int = DEFAULT_DATA_CHUNK_SIZE) -> Iterator[io.RawIOBase | None]:
        """The engine's archive of ``path`` as a stream read as it comes (None: nothing there), its
        response closed on the way out, read to its end or not. Not docker-py's get_archive: it gives
        a generator over the response that it never closes, and the engine holds the container's lock
        until an archive is read or its connection closed; the container's removal waits on that lock
        (a read cut short, a path's first entry or a cap passed, held it: docs/design/0479)."""
        api = self.client.api
        response = api._get(
            api._url("/containers/{0}/archive", ident),
            params={"path": path},
            stream=True,
            headers={"Accept-Encoding": "identity"},
        )
        with contextlib.closing(response):
            if response.status_code == 404:
                yield None
                return
            api._raise_for_status(response)
            yield _Chunks(response.iter_content(chunk))

    def path_digests(self, image: str, paths: Sequence[str]) -> dict[str, str]:
        """Each path's digest (every entry's name, type, mode, owner, link and content, in the archive's
        order) as the engine archives it from a container made but never started; ``absent`` where
        there is none."""
        with self._unstarted(image) as ident:
            return {path: self._digest(ident, path) for path in paths}

    def _digest(self, ident: str, path: str) -> str:
        with self._archive(ident, path) as stream:
            return ABSENT if stream is None else archive_digest(stream, MAX_DIGEST_BYTES)

    def read_files(self, image: str, paths: Sequence[str], limit: int) -> dict[str, bytes | None]:
        """Each file's first ``limit`` bytes as the engine archives it (None: no such regular file)."""
        with self._unstarted(image) as ident:
            return {path: self._read(ident, path, limit) for path in paths}

    def _read(self, ident: str, path: str, limit: int) -> bytes | None:
        with self._archive(ident, path) as stream:
            if stream is None:
                return None
            with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 16), mode="r|") as archive:
                for member in archive:
                    handle = archive.extractfile(member) if member.isfile() else None
                    return handle.read(limit) if handle is not None else None
        return None

    def link_targets(self, image: str, paths: Sequence[str]) -> dict[str, str | None]:
        """Where each path, a symbolic link, points in ``image`` (None: no link there), as the engine
        archives it from a container made but never started."""
        with self._unstarted(image) as ident:
            return {path: self._link(ident, path) for path in paths}

    def _link(self, ident: str, path: str) -> str | None:
        with self._archive(ident, path) as stream:
            if stream is None:
                return None
            with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 16), mode="r|") as archive:
                for member in archive:
                    return member.linkname if member.issym() else None
        return None

    def directory_entries(
        self, image: str, directory: str, digested: Collection[str] | None = None
    ) -> dict[str, DirectoryEntry]:
        """Every entry directly in ``directory`` of ``image`` (name -> its link target and digest), from
        one archive of it read as it streams (the check's libraries: hundreds of files in one request,
        where one request each took about a minute on a loaded host); nothing is run."""
        with self._unstarted(image) as ident, self._archive(ident, directory) as stream:
            return {} if stream is None else entry_digests(stream, MAX_DIRECTORY_BYTES, digested)

    def path_entries(self, image: str, paths: Sequence[str]) -> dict[str, DirectoryEntry | None]:
        """Each path's own entry (None: nothing there), from an archive of the path read to its first
        entry, all in one container made but never started. A directory's archive holds its whole tree
        behind that entry (``/``: the whole image, about 7 s to stream): the response is closed unread."""
        with self._unstarted(image) as ident:
            return {path: self._entry(ident, path) for path in paths}

    def _entry(self, ident: str, path: str) -> DirectoryEntry | None:
        try:
            with self._archive(ident, path, 1 << 16) as stream:
                if stream is None:
                    return None
                return first_entry(stream, MAX_DIGEST_BYTES, posixpath.basename(path))
        except docker.errors.APIError as exc:  # a directory on the way that is a file, a link loop
            raise SandboxError(f"cannot read {path} in the image: {exc.explanation or exc}") from None

    def setuid_files(self, image: str) -> list[str]:
        """The setuid and setgid files of ``image``, found by ``find`` in a check container: no network,
        no capability but reading every directory, read-only, for a bounded time and output."""
        container = self.client.containers.create(
            image,
            entrypoint=["find", "/", "-xdev", "-perm", "/6000", "-type", "f", "-print0"],
            network_mode="none",
            user="root",
            cap_drop=["ALL"],
            cap_add=["DAC_READ_SEARCH"],
            security_opt=["no-new-privileges"],
            read_only=True,
            healthcheck={"test": ["NONE"]},  # the image's would poll a controller that is not there
            log_config=LOG_CONFIG,
            labels=CHECK_LABELS,
            name=_check_name(),
        )
        try:
            container.start()
            status = container.wait(timeout=CHECK_TIMEOUT_S)
            output = container.logs(stdout=True, stderr=False)[:MAX_CHECK_OUTPUT]
        except Exception as exc:  # the engine's and requests' timeouts alike: the check did not run
            raise SandboxError(f"the template's check container failed: {exc}") from None
        finally:
            container.remove(force=True)
        if int(status.get("StatusCode", 1)) not in (0, 1):  # 1: find met an unreadable directory
            raise SandboxError(f"the template's check container exited {status.get('StatusCode')}")
        return sorted(name for name in output.decode("utf-8", "replace").split("\0") if name)


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks as a readable file (tarfile's stream mode reads from it)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._rest))
        buffer[:size], self._rest = self._rest[:size], self._rest[size:]
        return size


def archive_digest(stream: io.RawIOBase, limit: int) -> str:
    """A tar stream's digest by entry (name, type, mode, owner, link target, content's sha256), read
    in stream mode, never written anywhere; past ``limit`` bytes of content, an error."""
    total = hashlib.sha256()
    seen = 0
    with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 20), mode="r|") as archive:
        for member in archive:
            content = hashlib.sha256()
            if member.isfile():
                seen += member.size
                if seen > limit:
                    raise SandboxError(f"a checked path holds over {limit >> 20} MiB")
                handle = archive.extractfile(member)
                assert handle is not None  # a regular file always has its data
                while block := handle.read(1 << 20):
                    content.update(block)
            fields = (member.name, member.type.decode(), oct(member.mode), member.uid, member.gid, member.linkname)
            total.update(repr((*fields, content.hexdigest())).encode())
    return total.hexdigest()


MAX_DIRECTORY_BYTES = 4 << 30  # a checked directory's content, at most (the base's libraries: about 0.4 GiB)


def entry_digests(
    stream: io.RawIOBase, limit: int, digested: Collection[str] | None = None
) -> dict[str, DirectoryEntry]:
    """The direct entries of an archived directory: each one's link target and digest (type, mode,
    owner, link, content's sha256: of the ``digested`` names only, when given, the rest's content
    skipped unread and its digest empty); deeper entries are left out. Past ``limit`` bytes, an error."""
    entries: dict[str, DirectoryEntry] = {}
    seen = 0
    with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 20), mode="r|") as archive:
        for member in archive:
            parts = member.name.split("/")
            if len(parts) != 2 or not parts[1]:
                continue  # the directory itself, or something deeper in it
            if digested is not None and parts[1] not in digested:
                entries[parts[1]] = DirectoryEntry(member.linkname if member.issym() else None, "")
                continue
            if member.isfile():
                seen += member.size
                if seen > limit:
                    raise SandboxError(f"a checked directory holds over {limit >> 20} MiB")
            entries[parts[1]] = _member_entry(archive, member)
    return entries


def first_entry(stream: io.RawIOBase, limit: int, name: str) -> DirectoryEntry | None:
    """The first entry of an archive of the path ``.../name``: the path's own (the file, the link, or
    the directory before what it holds), digested as :func:`entry_digests` digests an entry; the rest
    is never read. None for an empty archive; a first entry of another name (the engine skips an entry
    it cannot add and goes on with what it holds) or a file past ``limit`` bytes, an error."""
    with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 16), mode="r|") as archive:
        for member in archive:
            if member.name.rstrip("/") != name:
                raise SandboxError(f"the archive of {name} begins with {member.name!r}, not {name} itself")
            if member.isfile() and member.size > limit:
                raise SandboxError(f"a checked file holds over {limit >> 20} MiB")
            return _member_entry(archive, member)
    return None


def _member_entry(archive: tarfile.TarFile, member: tarfile.TarInfo) -> DirectoryEntry:
    """One entry's link target and digest: its type, mode, owner, link and content's sha256."""
    content = hashlib.sha256()
    if member.isfile():
        handle = archive.extractfile(member)
        assert handle is not None  # a regular file always has its data
        while block := handle.read(1 << 20):
            content.update(block)
    fields = (member.type.decode(), oct(member.mode), member.uid, member.gid, member.linkname)
    digest = hashlib.sha256(repr((*fields, content.hexdigest())).encode()).hexdigest()
    return DirectoryEntry(member.linkname if member.issym() else None, digest)
