"""Whole files in and out of the sandbox over HTTP, as the agent: ``PUT /v1/files`` streams a raw
body into place (all or nothing, like ``file_write``), ``GET /v1/files`` streams a file's bytes, or
a directory as a tar stream made by ``tar`` run as the agent. Memory stays flat whatever the size."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, BinaryIO, Protocol, Self

from pydantic import Field, TypeAdapter

from corral.errors import ActionError, ErrorCode, StreamAborted
from corral.protocol.actions import MAX_CONTROL_WAIT_MS, FileMode, OnePath, parse_file_mode
from corral.protocol.validation import validate
from corral.sandbox.agent.launcher.client import Control, LauncherClient, SpawnRefused
from corral.sandbox.tools.files import CHUNK_BYTES, AgentFiles, Written, file_error, in_thread

TAR_MEDIA = "application/x-tar"
RAW_MEDIA = "application/octet-stream"


class Stream(Protocol):
    """Bytes as they come, and a way to stop and free what they come from."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class AgentCommand(Protocol):
    """Runs a program as the agent (the launcher's spawn) and streams what it writes to stdout."""

    async def stdout(self, argv: list[str], cwd: str) -> Stream:
        """Started (a failure to start raises OSError here, before anything is sent): its output."""
        ...


# What tar runs with: no proxy, no secrets, nothing of the controller's environment.
TAR_ENV = [b"PATH=/usr/local/bin:/usr/bin:/bin", b"LANG=C.UTF-8", b"HOME=/home/agent"]
# What ``du -s`` prints is one line: more than this is not du's answer.
_DU_OUTPUT_MAX = 4096
# How long a program whose stdout closed may take to be reported exited.
EXIT_WAIT_S = 30.0


class LauncherCommand:
    """:class:`AgentCommand` through the launcher's spawn: stdin and stderr are /dev/null, stdout a
    pipe read here, and at its end the exit status from the shepherd (a failure ends the stream with
    :class:`StreamAborted`). When the reader stops early (the client went away), the program's whole
    tree is killed."""

    def __init__(self, launcher: LauncherClient) -> None:
        self._launcher = launcher

    async def stdout(self, argv: list[str], cwd: str) -> Body:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            spawned = await self._launcher.spawn(
                [os.fsencode(arg) for arg in argv], TAR_ENV, os.fsencode(cwd), (null, write_end, null)
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
            os.close(null)
        if isinstance(spawned, SpawnRefused):
            os.close(read_end)
            raise spawned.error()
        pipe, control = os.fdopen(read_end, "rb", buffering=0), spawned.control

        def release() -> None:
            control.close()  # a shepherd whose channel closes kills what is left of its tree
            pipe.close()

        return Body(_drain(pipe, control), release)


class Body:
    """A response body and what it reads from: :meth:`aclose` frees that whether iteration began or not
    (closing an async generator that never started runs none of its ``finally``, and Starlette does not
    even close the body of a response whose client left before its first byte)."""

    def __init__(self, chunks: AsyncGenerator[bytes, None], release: Callable[[], None]) -> None:
        self._chunks, self._release = chunks, release

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            self._release()


async def _exited_well(control: Control) -> None:
    """Returns once the program exited 0, or 1 (GNU tar's "a file changed as it was read": the archive
    is still whole); raises :class:`StreamAborted` for any other exit, a signal, or a shepherd gone."""
    async with asyncio.timeout(EXIT_WAIT_S):  # its stdout is closed: it is exiting, or has
        while (event := await control.next_event()) is not None:
            if event.kind != "exited":
                continue
            if event.signal is None and event.exit_code in (0, 1):
                return
            how = f"signal {event.signal}" if event.signal is not None else f"exit status {event.exit_code}"
            raise StreamAborted(f"the program ended with {how}; what was sent is incomplete")
    raise StreamAborted("the program's shepherd went away before it exited")


async def _drain(pipe: BinaryIO, control: Control) -> AsyncGenerator[bytes, None]:
    """What ``pipe`` brings until its end, then the program's exit checked (a failure raises, so the
    stream is aborted); read by the event loop (paused while the client lags)."""
    reader = asyncio.StreamReader(limit=CHUNK_BYTES)
    # The transport gets a descriptor of its own: uvloop's closes the descriptor itself a moment after
    # close(), so on ``pipe``'s own number that late close would land on whatever the controller
    # opened meanwhile (the next program's stdio: EBADF, or worse). Each is closed once, by its owner.
    owned = os.fdopen(os.dup(pipe.fileno()), "rb", buffering=0)
    try:
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), owned
        )
    except BaseException:
        owned.close()
        raise
    try:
        while chunk := await reader.read(CHUNK_BYTES):
            yield chunk
        await _exited_well(control)
    finally:
        control.close()
        transport.close()


class FileQuery(OnePath):
    """The query of ``/v1/files``: ``path`` (or ``path_base64``), for a PUT ``make_dirs`` and ``mode``,
    ``wait_for_control_ms`` (how long the transfer waits while someone else holds the lease), and for a
    GET ``max_bytes`` (the gateway's ``CORRAL_MAX_DOWNLOAD_BYTES``; the controller's own cap without it)."""

    make_dirs: bool = False
    mode: FileMode | None = None
    wait_for_control_ms: Annotated[int, Field(ge=0, le=MAX_CONTROL_WAIT_MS)] = 0
    max_bytes: int | None = Field(default=None, ge=1)

    def field(self) -> str:
        return "path" if self.path is not None else "path_base64"

    def file_mode(self) -> int | None:
        return None if self.mode is None else parse_file_mode(self.mode)


_QUERY = TypeAdapter(FileQuery)


def file_query(params: Mapping[str, str]) -> FileQuery:
    """The query, checked like an action's fields (``invalid_field`` on ``path`` and the like)."""
    return validate(_QUERY, dict(params), "")


@dataclass(frozen=True, slots=True)
class Download:
    """What ``GET /v1/files`` sends: a media type, a length when known, and the bytes as they come."""

    media_type: str
    length: int | None
    body: Stream


async def receive(
    files: AgentFiles, query: FileQuery, body: AsyncIterator[bytes], declared: str | None, limit: int
) -> Written:
    """A raw body written to ``query``'s path; over ``limit`` → ``too_large`` (before anything is
    written when the length is declared)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ActionError(ErrorCode.TOO_LARGE, f"the upload is {declared} bytes; at most {limit}", "body")
    target = files.resolve(query.target())
    try:
        return await files.upload(target, body, limit=limit, mode=query.file_mode(), make_dirs=query.make_dirs)
    except OSError as exc:
        raise file_error(exc, query.field()) from None


def too_large(what: str, size: int, limit: int, field: str) -> ActionError:
    return ActionError(
        ErrorCode.TOO_LARGE,
        f"{what} is {size} bytes; a download is limited to {limit} bytes (CORRAL_MAX_DOWNLOAD_BYTES)",
        field,
    )


async def apparent_size(command: AgentCommand, path: str) -> int | None:
    """A directory's size as ``du`` run as the agent counts it: each file at its apparent size (a sparse
    file whole, as tar without ``--sparse`` sends it, holes as zeros) and each hard-linked file once (tar
    sends the others as link entries). None when ``du`` says nothing usable (the cut then bounds it)."""
    try:
        body = await command.stdout(["du", "-s", "--apparent-size", "--block-size=1", "."], path)
    except OSError:
        return None
    said = b""
    try:
        async for chunk in body:
            said += chunk
            if len(said) > _DU_OUTPUT_MAX:
                return None
    except StreamAborted:
        return None
    finally:
        await body.aclose()
    first = said.split(maxsplit=1)
    return int(first[0]) if first and first[0].isdigit() else None


async def send(files: AgentFiles, command: AgentCommand | None, query: FileQuery, limit: int) -> Download:
    """A file's bytes, or a directory as a tar stream, refused (``too_large``) when its apparent size is
    over ``limit`` (query's ``max_bytes`` wins). What can be known before the first byte (no such
    path, not readable by the agent, tar cannot start, too large) raises here, to be answered as an error body;
    a tar that fails later aborts the stream without its clean end (:class:`StreamAborted`), and a file
    that shrinks meanwhile sends fewer bytes than its content-length: either way the client sees the
    download cut short, never a short success."""
    path = files.resolve(query.target())
    try:
        found = await files.stat(path)
        if found.type == "directory":
            await files.listing(path, recursive=False, pattern=None, limit=1)  # readable by the agent?
        else:
            fd = await files.open_regular(path)
    except OSError as exc:
        raise file_error(exc, query.field()) from None
    except ActionError as exc:
        exc.field = exc.field or query.field()
        raise
    limit = query.max_bytes or limit
    if found.type == "directory":
        if command is None:
            raise ActionError(ErrorCode.UNSUPPORTED, "a directory is sent as a tar made by the launcher's spawn")
        size = await apparent_size(command, path)
        if size is not None and size > limit:
            raise too_large(f"the directory {path}", size, limit, query.field())
        # --ignore-failed-read: what the agent may not read is left out, the archive stays whole. Hard
        # links stay link entries (tar's default), so a farm of links to one file costs its size once.
        argv = ["tar", "-C", path, "--ignore-failed-read", "-cf", "-", "."]
        try:
            body = await command.stdout(argv, path)
        except OSError as exc:
            raise file_error(exc, query.field()) from None
        return Download(TAR_MEDIA, None, body)
    opened, size = os.fdopen(fd, "rb", buffering=0), os.fstat(fd).st_size
    if size > limit:  # the apparent size: a sparse file's holes count, and are never streamed
        opened.close()
        raise too_large(f"the file {path}", size, limit, query.field())
    return Download(RAW_MEDIA, size, Body(read_file(opened, size), opened.close))


async def read_file(opened: BinaryIO, size: int) -> AsyncGenerator[bytes, None]:
    """``size`` bytes of ``opened`` (what the file held when asked; a file that grows is cut there), then closes it."""
    try:
        sent = 0
        while sent < size:
            chunk = await in_thread(opened.read, min(CHUNK_BYTES, size - sent))
            if not chunk:
                break  # it shrank meanwhile: the length sent was a promise the file broke
            sent += len(chunk)
            yield chunk
    finally:
        opened.close()
