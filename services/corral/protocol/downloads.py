"""A download as the controller lists it, the gateway passes it on and the clients read it: frozen
pydantic models (the names and bounds in :mod:`corral.contracts.downloads`). The gateway validates the
controller's answer with these before it passes one on: the sandbox's word, bounded."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from corral.contracts.downloads import DOWNLOAD_ID, MAX_DOWNLOADS, MAX_NAME_CHARS, MAX_URL_CHARS

_Frozen = ConfigDict(extra="forbid", frozen=True)
DownloadId = Annotated[str, StringConstraints(pattern=f"^{DOWNLOAD_ID.pattern}$")]
DownloadStateField = Literal["in_progress", "completed", "canceled", "capped", "interrupted"]


class DownloadCause(BaseModel):
    """What made the browser download: ``action`` (a native action: its ``action_id`` as the audit
    names it and its ``action`` type, ``navigate`` or ``click`` say), ``cdp`` (a CDP connection's
    command: ``actor`` ``cdp:<conn>``, ``action_id`` its activity window when the session has egress
    control), or ``browser`` (no action ran: a page's own script or timer)."""

    model_config = _Frozen

    kind: Literal["action", "cdp", "browser"]
    action_id: Annotated[str, Field(max_length=64)] | None = None
    action: Annotated[str, Field(max_length=64)] | None = None
    actor: Annotated[str, Field(max_length=64)] | None = None


class Download(BaseModel):
    """One download: ``name`` is the file's name in ``~/Downloads`` (made safe: corral.contracts.downloads.
    safe_name), ``size`` the bytes received so far (the whole file once ``completed``), ``total_bytes``
    what the server announced (None: unknown), ``mime_type`` guessed from the name."""

    model_config = _Frozen

    id: DownloadId
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    path: Annotated[str, Field(max_length=512)] | None = None  # where the agent finds it, once known
    url: Annotated[str, Field(max_length=MAX_URL_CHARS + 1)]
    mime_type: Annotated[str, Field(max_length=128)]
    state: DownloadStateField
    size: Annotated[int, Field(ge=0)]
    total_bytes: Annotated[int, Field(ge=0)] | None = None
    started_at: float
    finished_at: float | None = None
    cause: DownloadCause
    error: Annotated[str, Field(max_length=512)] | None = None  # why a capped or interrupted one stopped


class DownloadList(BaseModel):
    """``GET /v1/sessions/{id}/downloads``: every download of the session, oldest first, and the caps."""

    model_config = _Frozen

    downloads: Annotated[list[Download], Field(max_length=MAX_DOWNLOADS)]
    total_bytes: Annotated[int, Field(ge=0)]
    max_file_bytes: Annotated[int, Field(ge=0)]
    max_session_bytes: Annotated[int, Field(ge=0)]


__all__ = ["Download", "DownloadCause", "DownloadId", "DownloadList"]
