"""``/v1/replay-responses``: a recording's responses uploaded for hermetic sessions."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from corral.errors import InvalidRequest, UploadTooLarge
from corral.gateway.models import ReplayResponsesOut
from corral.gateway.routes.deps import KeyIdDep, ManagerDep

router = APIRouter(prefix="/v1/replay-responses", tags=["replays"])


@router.post("", status_code=201, response_model=ReplayResponsesOut)
async def upload_replay_responses(request: Request, key_id: KeyIdDep, manager: ManagerDep) -> ReplayResponsesOut:
    """A recording's responses.mitm, for hermetic sessions (``"hermetic": "<id>"`` at create)."""
    uploads = manager.replays
    upload_id, part = uploads.begin()
    size = 0
    try:
        with part.open("wb") as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > uploads.max_bytes:
                    raise UploadTooLarge(f"recorded responses are limited to {uploads.max_bytes >> 20} MiB")
                await asyncio.to_thread(out.write, chunk)
        checked = await asyncio.to_thread(uploads.finish, upload_id, part, key_id)
    except ValueError as exc:
        raise InvalidRequest(f"this is {exc}; send a recording's responses.mitm") from None
    finally:
        part.unlink(missing_ok=True)
    return ReplayResponsesOut(id=upload_id, flows=checked.flows, bytes=checked.complete, torn=checked.torn)


@router.delete("/{upload_id}", status_code=204)
async def delete_replay_responses(upload_id: str, key_id: KeyIdDep, manager: ManagerDep) -> Response:
    await asyncio.to_thread(manager.replays.delete, upload_id, key_id)
    return Response(status_code=204)
