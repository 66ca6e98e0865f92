"""Downloads: what the controller, the gateway and the clients agree on (docs/downloads.md).

A download is one file Chromium saved, whoever made it save it (a native ``navigate`` or click, a CDP
client, a page on its own). Its id is Chromium's download GUID; its name is what the sandbox said,
so nothing of it is trusted: :func:`safe_name` makes a name fit to show and to save under, and
:func:`content_disposition` the header that hands it to a client without letting a browser render
it. Pure, standard library only.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
from typing import Final, Literal

# Where Chromium's managed policy saves every download (corral.sandbox.startup.boot's DownloadDirectory).
DOWNLOADS_DIR: Final = "/home/agent/Downloads"
# A download's id: Chromium's GUID (36 characters); a little room for another browser's form.
DOWNLOAD_ID: Final = re.compile(r"[A-Za-z0-9-]{1,64}")
# in_progress: still coming; completed: whole and on disk; canceled: stopped by a page, a client or
# the user; capped: stopped by Corral for passing a cap (``error`` says which); interrupted: Chromium
# gave up (network, disk).
DownloadState = Literal["in_progress", "completed", "canceled", "capped", "interrupted"]
STATES: Final = ("in_progress", "completed", "canceled", "capped", "interrupted")
FINISHED: Final = frozenset({"completed", "canceled", "capped", "interrupted"})
# What caused it: a native action (its id and kind), a CDP connection's command, or the browser alone
# (a page's script, a redirect after every action ended).
CauseKind = Literal["action", "cdp", "browser"]
CAUSE_KINDS: Final = ("action", "cdp", "browser")
# The audit's download records (op ``download``): the controller reports ``started`` and how each
# ended; the gateway reports each ``fetched`` (who, how many bytes).
DOWNLOAD_CHANGES: Final = ("started", "completed", "canceled", "capped", "interrupted", "fetched")
# Bounds on what the sandbox may make the host hold or show.
MAX_NAME_CHARS: Final = 200
MAX_URL_CHARS: Final = 2048
MAX_DOWNLOADS: Final = 1000  # records kept per session (the oldest finished ones go first)
DEFAULT_MAX_FILE_BYTES: Final = 512 << 20
DEFAULT_MAX_SESSION_BYTES: Final = 2 << 30
FALLBACK_NAME: Final = "download"
# Characters never kept in a name: path separators, NUL, and those Windows refuses (a name is saved
# on clients' machines too); control and format characters (bidi overrides) go by category.
_REFUSED = frozenset('/\\:*?"<>|\x00')


def safe_name(raw: str) -> str:
    """A file name fit to show and to save under on any client: one path component, no control or
    bidi characters, no leading dot or trailing dot or space, at most :data:`MAX_NAME_CHARS`
    characters (the extension kept where it can be), never empty, ``.`` or ``..``."""
    name = unicodedata.normalize("NFC", raw.replace("\\", "/").rsplit("/", 1)[-1])
    kept = "".join("_" if ch in _REFUSED or (unicodedata.category(ch)[0] in "CZ" and ch != " ") else ch for ch in name)
    kept = kept.strip(" .").lstrip("-")
    if len(kept) > MAX_NAME_CHARS:
        stem, dot, extension = kept.rpartition(".")
        if dot and 0 < len(extension) <= 16 and stem:
            kept = stem[: MAX_NAME_CHARS - len(extension) - 1].rstrip(" .") + "." + extension
        else:
            kept = kept[:MAX_NAME_CHARS].rstrip(" .")
    return kept if kept and kept not in (".", "..") else FALLBACK_NAME


def content_disposition(name: str) -> str:
    """``attachment`` with the name twice: an ASCII fallback (quoted, no quote or backslash in it) and
    RFC 5987's UTF-8 form; never ``inline``, so a browser saves what the sandbox made, never renders it."""
    shown = safe_name(name)
    ascii_name = "".join(ch if 0x20 < ord(ch) < 0x7F and ch not in '"\\%;' else "_" for ch in shown)
    encoded = urllib.parse.quote(shown, safe="")
    return f"attachment; filename=\"{ascii_name or FALLBACK_NAME}\"; filename*=UTF-8''{encoded}"


def id_problem(download_id: str) -> str | None:
    """Why ``download_id`` is no download's id, or None."""
    if DOWNLOAD_ID.fullmatch(download_id) is None:
        return "a download's id is 1 to 64 letters, digits or -"
    return None


def file_in_downloads(path: object) -> str | None:
    """The file's name when ``path`` (Chromium's ``filePath``, the sandbox's word) is a file directly in
    :data:`DOWNLOADS_DIR`; None for anything else (another folder, ``..``, a name with a slash)."""
    if not isinstance(path, str) or not path.startswith(DOWNLOADS_DIR + "/"):
        return None
    name = path[len(DOWNLOADS_DIR) + 1 :]
    if not name or "/" in name or name in (".", "..") or "\x00" in name or len(name.encode()) > 255:
        return None
    return name


__all__ = [
    "CAUSE_KINDS",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_SESSION_BYTES",
    "DOWNLOADS_DIR",
    "DOWNLOAD_CHANGES",
    "DOWNLOAD_ID",
    "FALLBACK_NAME",
    "FINISHED",
    "MAX_DOWNLOADS",
    "MAX_NAME_CHARS",
    "MAX_URL_CHARS",
    "STATES",
    "CauseKind",
    "DownloadState",
    "content_disposition",
    "file_in_downloads",
    "id_problem",
    "safe_name",
]
