"""``sb.files``: files in the sandbox, read and written as the agent, in each twin; ``upload`` and
``download`` stream through the gateway's HTTP routes."""

from __future__ import annotations

import asyncio
import builtins
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from corral import transfer
from corral.errors import ActionFailed, ErrorCode, InvalidRequest
from corral.gateway_client import Download
from corral.gateway_models import UploadedFile
from corral.protocol.results import FileEntry, FileListing, FileMoved, FileRemoved, FileWritten
from corral.sdk.messages import Message, messages

if TYPE_CHECKING:
    from corral.sdk.connection import AsyncConnected, Connected

# What ``files.read`` answers: E2B's ``format`` names ("bytes", "text"); the default stays bytes.
ReadFormat = Literal["bytes", "text"]


def _reading(path: str, format: str, offset: int, length: int | None) -> Message[bytes | str]:
    read: Message[bytes] | Message[str]
    if format == "bytes":
        read = messages.file_read(path, offset, length)
    elif format == "text":
        read = messages.file_read_text(path, offset, length)
    else:
        raise InvalidRequest(f"format is 'bytes' (the default) or 'text' (UTF-8, as str), not {format!r}", "format")
    return Message(read.body, read.read)


def _download_part(local: Path) -> Path:
    """A fresh name beside ``local`` for the download to land on before it is settled there."""
    local.parent.mkdir(parents=True, exist_ok=True)
    return local.with_name(f".{local.name}.{secrets.token_hex(6)}.download")


def _is_tree(plan: Sequence[tuple[Path, str]], local: Path) -> bool:
    """Whether an upload plan is a directory's (then every file goes with its directories made)."""
    return not (len(plan) == 1 and plan[0][0] == local)


class Files:
    """``sb.files``: files in the sandbox, read and written as the agent. ``read``/``write``/``list``/
    ``stat``/``remove``/``move`` are actions (a reply holds at most 8 MiB of content); ``upload`` and
    ``download`` stream through the gateway's HTTP routes, any size, from and to local files."""

    def __init__(self, sandbox: Connected) -> None:
        self._sandbox = sandbox

    @overload
    def read(
        self, path: str, *, format: Literal["bytes"] = "bytes", offset: int = 0, length: int | None = None
    ) -> bytes: ...
    @overload
    def read(self, path: str, *, format: Literal["text"], offset: int = 0, length: int | None = None) -> str: ...
    def read(
        self, path: str, *, format: ReadFormat = "bytes", offset: int = 0, length: int | None = None
    ) -> bytes | str:
        """The file's bytes, or with ``format="text"`` its text (UTF-8, strictly: other bytes raise
        :class:`CorralError`); ``offset`` and ``length`` in bytes either way. The type follows ``format``."""
        return self._sandbox._send(_reading(path, format, offset, length))

    def write(
        self,
        path: str,
        content: str | bytes,
        *,
        append: bool = False,
        mode: int | str | None = None,
        make_dirs: bool = False,
    ) -> FileWritten:
        """Written whole or not at all: its path, size and SHA-256."""
        return self._sandbox._send(messages.file_write(path, content, append, mode, make_dirs))

    def list(
        self, path: str = ".", *, recursive: bool = False, pattern: str | None = None, limit: int | None = None
    ) -> FileListing:
        """Its entries (path, name, type, size, mode, mtime) and whether the listing was cut."""
        return self._sandbox._send(messages.file_list(path, recursive, pattern, limit))

    def stat(self, path: str) -> FileEntry:
        return self._sandbox._send(messages.file_stat(path))

    def remove(self, path: str, *, recursive: bool = False) -> FileRemoved:
        return self._sandbox._send(messages.file_remove(path, recursive))

    def move(self, source: str, destination: str, *, overwrite: bool = False) -> FileMoved:
        return self._sandbox._send(messages.file_move(source, destination, overwrite))

    def upload(
        self, local: str | Path, remote: str, *, make_dirs: bool = False, mode: str | None = None
    ) -> builtins.list[UploadedFile]:
        """A local file, or a directory file by file (its directories made), to ``remote`` (into it when
        it ends with ``/`` or, for a file, is an existing directory, as cp does): one
        :class:`UploadedFile` (path, size, SHA-256) per file written."""
        if transfer.may_be_directory(Path(local), remote) and self._is_directory(remote):
            remote += "/"
        plan = transfer.upload_plan(Path(local), transfer.remote_target(Path(local), remote))
        tree = _is_tree(plan, Path(local))
        gateway, session = self._sandbox._gateway, self._sandbox.id
        return [
            gateway.upload_file(session, target, source, make_dirs=make_dirs or tree, mode=mode)
            for source, target in plan
        ]

    def _is_directory(self, path: str) -> bool:
        try:
            return self.stat(path).type == "directory"
        except ActionFailed as exc:
            if exc.code == ErrorCode.NO_SUCH_FILE:
                return False
            raise

    def download(self, remote: str, local: str | Path) -> Path:
        """A file to ``local``, or a directory (a tar the sandbox packs) unpacked into ``local``."""
        target = Path(local)
        got = self._sandbox._gateway.download_file(self._sandbox.id, remote, _download_part(target))
        return transfer.settle(got, target)


class AsyncFiles:
    """The async twin of :class:`Files`."""

    def __init__(self, sandbox: AsyncConnected) -> None:
        self._sandbox = sandbox

    @overload
    async def read(
        self, path: str, *, format: Literal["bytes"] = "bytes", offset: int = 0, length: int | None = None
    ) -> bytes: ...
    @overload
    async def read(self, path: str, *, format: Literal["text"], offset: int = 0, length: int | None = None) -> str: ...
    async def read(
        self, path: str, *, format: ReadFormat = "bytes", offset: int = 0, length: int | None = None
    ) -> bytes | str:
        """The file's bytes, or with ``format="text"`` its text (see :meth:`Files.read`)."""
        return await self._sandbox._send(_reading(path, format, offset, length))

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        append: bool = False,
        mode: int | str | None = None,
        make_dirs: bool = False,
    ) -> FileWritten:
        return await self._sandbox._send(messages.file_write(path, content, append, mode, make_dirs))

    async def list(
        self, path: str = ".", *, recursive: bool = False, pattern: str | None = None, limit: int | None = None
    ) -> FileListing:
        return await self._sandbox._send(messages.file_list(path, recursive, pattern, limit))

    async def stat(self, path: str) -> FileEntry:
        return await self._sandbox._send(messages.file_stat(path))

    async def remove(self, path: str, *, recursive: bool = False) -> FileRemoved:
        return await self._sandbox._send(messages.file_remove(path, recursive))

    async def move(self, source: str, destination: str, *, overwrite: bool = False) -> FileMoved:
        return await self._sandbox._send(messages.file_move(source, destination, overwrite))

    async def upload(
        self, local: str | Path, remote: str, *, make_dirs: bool = False, mode: str | None = None
    ) -> builtins.list[UploadedFile]:
        if transfer.may_be_directory(Path(local), remote) and await self._is_directory(remote):
            remote += "/"
        target = transfer.remote_target(Path(local), remote)
        plan = await asyncio.to_thread(transfer.upload_plan, Path(local), target)
        tree = _is_tree(plan, Path(local))
        gateway, session = self._sandbox._gateway, self._sandbox.id
        return [
            await gateway.upload_file(session, target, source, make_dirs=make_dirs or tree, mode=mode)
            for source, target in plan
        ]

    async def _is_directory(self, path: str) -> bool:
        try:
            return (await self.stat(path)).type == "directory"
        except ActionFailed as exc:
            if exc.code == ErrorCode.NO_SUCH_FILE:
                return False
            raise

    async def download(self, remote: str, local: str | Path) -> Path:
        target = Path(local)
        part = await asyncio.to_thread(_download_part, target)
        got: Download = await self._sandbox._gateway.download_file(self._sandbox.id, remote, part)
        return await asyncio.to_thread(transfer.settle, got, target)
