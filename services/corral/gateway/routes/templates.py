"""``/v1/templates``: build (the build context as a tar; the answer streams its progress as NDJSON and
ends with the template or the error), list, show (versions) and delete templates. Names are
gateway-wide: any API key lists and starts sessions from any template; only the key that built one
rebuilds or deletes it (to another key it is absent: 404)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict
from starlette.requests import HTTPConnection
from starlette.responses import StreamingResponse

from corral.bodies import read_capped
from corral.errors import CodedError, SandboxError, TemplateBuildFailed, UploadTooLarge
from corral.gateway.routes.deps import KeyIdDep, ManagerDep, SettingsDep
from corral.gateway.routes.errors import public_error
from corral.gateway.templates.builder import Built, TemplateBuilder
from corral.gateway.templates.catalog import TemplateRecord, TemplateVersion, image_reference

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/templates", tags=["templates"])
MAX_LINE = 2000  # a progress line's characters, at most (the builder's lines can be anything)


def _builder(conn: HTTPConnection) -> TemplateBuilder:
    builder: TemplateBuilder = conn.app.state.templates
    return builder


BuilderDep = Annotated[TemplateBuilder, Depends(_builder)]


class VersionOut(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int
    image: str  # corral-template/NAME:VERSION
    image_id: str
    created_at: float
    size: int
    env: dict[str, str]


class TemplateOut(BaseModel):
    """A template: its name, its newest version, and whether the caller's key built it (its builder may
    rebuild and delete it; every key may use it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    latest: int
    mine: bool
    versions: list[VersionOut]


class BuiltOut(VersionOut):
    name: str
    cached: bool  # the same file, context and base: this version again, without a build


def _version(name: str, version: TemplateVersion) -> VersionOut:
    return VersionOut(
        version=version.version,
        image=image_reference(name, version.version),
        image_id=version.image_id,
        created_at=version.created_at,
        size=version.size,
        env=version.env,
    )


def _template(record: TemplateRecord, key_id: str) -> TemplateOut:
    versions = [_version(record.name, v) for v in record.versions]
    return TemplateOut(name=record.name, latest=record.latest.version, mine=record.owner == key_id, versions=versions)


def _line(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload) + "\n").encode()


def _error_line(exc: CodedError) -> bytes:
    error: dict[str, Any] = dict(public_error(exc))
    if isinstance(exc, TemplateBuildFailed):
        error |= {"step": exc.step, "output": exc.output}
    return _line({"error": error})


@router.post("", response_class=StreamingResponse)
async def build_template(
    request: Request,
    key_id: KeyIdDep,
    settings: SettingsDep,
    builder: BuilderDep,
    manager: ManagerDep,
    name: Annotated[str, Query(min_length=1, max_length=64)],
    file: Annotated[str | None, Query(min_length=1, max_length=1024)] = None,
) -> StreamingResponse:
    """Body: the build context, a tar (gzip or not) holding ``corral.template.yaml`` or a Dockerfile
    (``file`` names another). Answer: NDJSON lines ``{"progress": "..."}`` as the build goes, then
    ``{"template": {...}}`` or ``{"error": {"code", "message", "step", "output"}}``. What is wrong
    before a build starts (the body, the file, the name) is an ordinary error answer instead."""
    limit = settings.template_context_max_mb << 20
    upload = await read_capped(request, limit)
    if upload is None:
        raise UploadTooLarge(f"a template's build context is at most {settings.template_context_max_mb} MiB")
    prepared = await asyncio.to_thread(builder.prepare, key_id, name, upload, file)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()

    def progress(text: str) -> None:
        loop.call_soon_threadsafe(lines.put_nowait, _line({"progress": text[:MAX_LINE]}))

    async def run() -> None:
        try:
            built: Built = await asyncio.to_thread(builder.build, prepared, progress)
            out = BuiltOut(**_version(name, built.version).model_dump(), name=name, cached=built.cached)
            manager.templates.refill(name)  # its pool, if it has one, takes the new version
            await lines.put(_line({"template": out.model_dump(mode="json")}))
        except CodedError as exc:
            await lines.put(_error_line(exc))
        except Exception as exc:  # the engine's own failure: said as the runtime's, its words in the log
            log.exception("template %s: the build failed", name)
            await lines.put(_error_line(SandboxError(str(exc))))
        finally:
            await lines.put(None)

    # Kept on the app: the build runs to its end (and is recorded) even if the client goes.
    task = asyncio.create_task(run())
    builds: set[asyncio.Task[None]] = request.app.state.template_builds
    builds.add(task)
    task.add_done_callback(builds.discard)

    async def stream() -> AsyncIterator[bytes]:
        while (line := await lines.get()) is not None:
            yield line

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@router.get("", response_model=list[TemplateOut])
async def list_templates(key_id: KeyIdDep, builder: BuilderDep) -> list[TemplateOut]:
    return [_template(record, key_id) for record in await asyncio.to_thread(builder.listing)]


@router.get("/{name}", response_model=TemplateOut)
async def get_template(name: str, key_id: KeyIdDep, builder: BuilderDep) -> TemplateOut:
    return _template(await asyncio.to_thread(builder.show, name), key_id)


@router.delete("/{name}", status_code=204)
async def delete_template(
    name: str,
    key_id: KeyIdDep,
    builder: BuilderDep,
    manager: ManagerDep,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    await asyncio.to_thread(builder.delete, key_id, name, version)
    manager.templates.refill(name)
    return Response(status_code=204)
