"""The controller's downloads routes, for the gateway: ``GET /v1/downloads`` (every download of the
session: corral.protocol.downloads.DownloadList) and ``GET /v1/downloads/{id}`` (one download's bytes,
read as the agent and checked: corral.sandbox.tools.downloadfiles), and the watch that fills the
book they read (corral.sandbox.web.downloadwatch), started once the controller serves."""

from __future__ import annotations

import pwd

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from corral.bodies import ClosingStream
from corral.contracts.downloads import content_disposition, id_problem
from corral.errors import ActionError, ErrorCode
from corral.sandbox.desktop import Desktop
from corral.sandbox.tools import downloadfiles

BROWSER_USER = "browser"  # Chromium's uid (corral.sandbox.startup.init): every download's file is its


def browser_uid() -> int | None:
    try:
        return pwd.getpwnam(BROWSER_USER).pw_uid
    except KeyError:
        return None


async def listing(request: Request) -> JSONResponse:
    desktop: Desktop = request.app.state.desktop
    return JSONResponse({"ok": True, **desktop.browser.downloads.listing().model_dump(mode="json")})


async def fetch(request: Request) -> Response:
    """One download's bytes: ``Content-Type`` its MIME type, ``Content-Disposition`` an attachment
    under its safe name, at most the bytes its record counted."""
    desktop: Desktop = request.app.state.desktop
    download_id = str(request.path_params["download_id"])
    problem = id_problem(download_id)
    record = desktop.browser.downloads.get(download_id) if problem is None else None
    if record is None:
        raise ActionError(ErrorCode.NO_SUCH_DOWNLOAD, problem or f"no download {download_id!r}", "download_id")
    uid = request.app.state.browser_uid
    if desktop.processes is None or uid is None:
        raise ActionError(ErrorCode.UNSUPPORTED, "downloads are read through the sandbox's launcher, not running")
    opened = await downloadfiles.open_download(desktop.processes.launcher, record, uid)
    body = downloadfiles.body(opened)
    headers = {
        "content-length": str(opened.length),
        "content-disposition": content_disposition(record.name),
        "x-content-type-options": "nosniff",
    }
    return ClosingStream(body, body.aclose, media_type=record.mime_type, headers=headers)


__all__ = ["browser_uid", "fetch", "listing"]
