"""A download's file, opened for ``GET /v1/downloads/{id}`` without trusting the folder it lies in.

``~/Downloads`` is the agent's: a process of its uid may rename, replace or link anything there
between Chromium's save and the gateway's read (a symlink to ``/etc/shadow`` or to the controller's
secret, a hard link to another file). So the file is opened as the agent (through the launcher: what
the agent cannot read, nothing here reads), with ``O_NOFOLLOW`` (a link in the name's place is
refused, never followed), and then held to what Chromium saved: a regular file of the browser's
uid with one link. At most the bytes the download's record counted are sent.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from corral.contracts.downloads import file_in_downloads
from corral.errors import ActionError, ErrorCode
from corral.protocol.downloads import Download
from corral.sandbox.tools.agentfs import AgentFs
from corral.sandbox.tools.transfer import Body, read_file

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW  # a FIFO must not block


@dataclass(frozen=True, slots=True)
class Opened:
    """The download's file: an fd the caller closes, and how many bytes to send from it."""

    fd: int
    length: int


def unavailable(record: Download, why: str) -> ActionError:
    return ActionError(ErrorCode.DOWNLOAD_UNAVAILABLE, f"download {record.id} ({record.name}) {why}", "download_id")


async def open_download(fs: AgentFs, record: Download, browser_uid: int) -> Opened:
    """``record``'s file, checked (see the module's docstring); ``no_such_download`` when it is gone,
    ``download_unavailable`` when it is not whole or not what the browser saved."""
    if record.state != "completed":
        why = record.error or f"is {record.state.replace('_', ' ')}"
        raise unavailable(record, why if record.state == "in_progress" else f"has no file: {why}")
    if record.path is None or file_in_downloads(record.path) is None:
        raise unavailable(record, "has no file in the Downloads folder")
    try:
        fd = await fs.open(record.path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise unavailable(record, "was replaced by a symbolic link: not followed") from None
        if exc.errno == errno.ENOENT:
            raise ActionError(
                ErrorCode.NO_SUCH_DOWNLOAD, f"download {record.id}'s file {record.path} is gone", "download_id"
            ) from None
        raise unavailable(record, f"cannot be read: {exc.strerror}") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != browser_uid or found.st_nlink != 1:
            raise unavailable(record, "was replaced by a file the browser did not save")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return Opened(fd, min(found.st_size, record.size))


def body(opened: Opened) -> Body:
    """The file's first ``opened.length`` bytes as a response body (the fd closed at its end, or when
    the response is closed before it began)."""
    reading = os.fdopen(opened.fd, "rb", buffering=0)
    return Body(read_file(reading, opened.length), reading.close)


__all__ = ["Opened", "body", "open_download", "unavailable"]
