"""``/v1/volumes``: the API key's workspace volumes (corral.gateway.volumes): made with a size (its
quota), listed with their use and holder, deleted when no session holds them. Another key's volume
is not found, as one that does not exist."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from corral.errors import SandboxError, SandboxStartFailed
from corral.gateway.models import CreateVolume, VolumeName, VolumeOut
from corral.gateway.routes.deps import JsonBody, KeyIdDep, ManagerDep, body_of

router = APIRouter(prefix="/v1/volumes", tags=["volumes"])

NameInPath = Annotated[VolumeName, Path()]


@router.post("", status_code=201, response_model=VolumeOut)
async def create_volume(
    key_id: KeyIdDep, manager: ManagerDep, reading: Annotated[JsonBody[CreateVolume], body_of(CreateVolume)]
) -> VolumeOut:
    """A new volume of ``size_mb`` (its space reserved on the host), empty, its root the agent's."""
    body = await reading.read()
    try:
        return await manager.volumes.create(key_id, body.name, body.size_mb)
    except SandboxError as exc:  # the host could not make its image: said in the log, not to the caller
        raise SandboxStartFailed(f"volume {body.name!r} could not be made: {exc}") from exc


@router.get("", response_model=list[VolumeOut])
async def list_volumes(key_id: KeyIdDep, manager: ManagerDep) -> list[VolumeOut]:
    return await manager.volumes.owned(key_id)


@router.get("/{name}", response_model=VolumeOut)
async def get_volume(name: NameInPath, key_id: KeyIdDep, manager: ManagerDep) -> VolumeOut:
    return await manager.volumes.get(key_id, name)


@router.delete("/{name}", status_code=204)
async def delete_volume(name: NameInPath, key_id: KeyIdDep, manager: ManagerDep) -> Response:
    """The volume and its image; 409 ``volume_in_use`` while a session holds it."""
    await manager.volumes.delete(key_id, name)
    return Response(status_code=204)
