"""``/v1/templates`` over the fake runtime: a build's NDJSON answer, its refusals, the listing, owners'
deletes, and a session created from a template (its checked image, a missing one's 404)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from corral.gateway.app import build_sessions
from corral.gateway.store import SessionStore
from corral.gateway.templates.builder import TemplateBuilder
from corral.gateway.templates.catalog import TemplateCatalog
from corral.runtime import ImageInfo, SandboxAddress, SandboxSpec

from .conftest import KEY, OTHER_KEY, LoopbackRuntime, client_for, settings_for, wired


class Recording(LoopbackRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.specs: list[SandboxSpec] = []

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        self.specs.append(spec)
        return super().start_sandbox(spec)


def _app(tmp_path: Path) -> tuple[FastAPI, Recording]:
    settings = settings_for(tmp_path)
    runtime = Recording()
    base = ImageInfo("sha256:base", ("a",), ("python",), None, "root", None, (), (), {}, 1)
    runtime.images[settings.image] = runtime.images[base.id] = base
    app = wired(settings)
    app.state.manager = build_sessions(settings, runtime, SessionStore(settings.data_dir))
    app.state.templates = TemplateBuilder(runtime, TemplateCatalog(tmp_path), settings.image, settings.network)
    app.state.template_builds = set()
    return app, runtime


def _tar(**files: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def _build(c: httpx.AsyncClient, name: str, **files: bytes) -> list[dict[str, Any]]:
    reply = await c.post("/v1/templates", params={"name": name}, content=_tar(**files))
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in reply.text.splitlines()]


async def test_a_build_streams_its_progress_and_ends_with_the_template(tmp_path: Path) -> None:
    app, runtime = _app(tmp_path)
    async with client_for(app, KEY) as owner, client_for(app, OTHER_KEY) as other:
        lines = await _build(owner, "tools", **{"corral.template.yaml": b"apt: [make]\nenv: {A: b}\n"})
        assert any("progress" in line for line in lines[:-1])
        made = lines[-1]["template"]
        assert (made["name"], made["version"], made["cached"], made["env"]) == ("tools", 1, False, {"A": "b"})
        assert made["image"] == "corral-template/tools:1"
        again = await _build(owner, "tools", **{"corral.template.yaml": b"apt: [make]\nenv: {A: b}\n"})
        assert again[-1]["template"]["cached"] is True
        listed = (await other.get("/v1/templates")).json()
        assert [(t["name"], t["latest"], t["mine"]) for t in listed] == [("tools", 1, False)]
        assert (await other.delete("/v1/templates/tools")).status_code == 404
        created = await other.post("/v1/sessions", json={"template": "tools"})
        assert created.status_code == 201 and created.json()["template"] == "tools:1"
        assert runtime.specs[-1].image == made["image_id"]  # the checked image, by id
        assert (await owner.delete("/v1/templates/tools", params={"version": 1})).status_code == 204
        assert (await owner.get("/v1/templates/tools")).status_code == 404
    await app.state.http.aclose()


async def test_a_refused_template_ends_its_answer_with_the_reason(tmp_path: Path) -> None:
    app, runtime = _app(tmp_path)

    def setuid(dockerfile: str, image: ImageInfo) -> ImageInfo:
        runtime.setuid[image.id] = ["/usr/local/bin/x"]
        return image

    runtime.on_build = setuid
    async with client_for(app, KEY) as owner:
        lines = await _build(owner, "bad", **{"corral.template.yaml": b"setup: 'chmod u+s /usr/local/bin/x'\n"})
        error = lines[-1]["error"]
        assert error["code"] == "template_refused" and "/usr/local/bin/x" in error["message"]
        assert (await owner.get("/v1/templates/bad")).status_code == 404
    await app.state.http.aclose()


async def test_what_is_wrong_before_a_build_is_an_ordinary_error(tmp_path: Path) -> None:
    app, _ = _app(tmp_path)
    async with client_for(app, KEY) as owner:
        not_tar = await owner.post("/v1/templates", params={"name": "x"}, content=b"not a tar")
        assert not_tar.status_code == 422 and not_tar.json()["error"]["code"] == "template_invalid"
        bad_name = await owner.post("/v1/templates", params={"name": "Bad Name"}, content=_tar(a=b""))
        assert bad_name.status_code == 422 and bad_name.json()["error"]["field"] == "name"
        entry = _tar(Dockerfile=b'FROM corral-desktop:latest\nENTRYPOINT ["sh"]\n')
        refused = await owner.post("/v1/templates", params={"name": "x"}, content=entry)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "template_refused"
        missing = await owner.post("/v1/sessions", json={"template": "nope:3"})
        assert missing.status_code == 404
        assert missing.json()["error"] == {"code": "not_found", "message": "no template nope:3", "field": "template"}
    await app.state.http.aclose()
