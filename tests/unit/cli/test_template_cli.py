"""``corral template``: the context packed and sent, the build's progress printed, its error as a
clean failure with the step and output; list and rm."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import httpx
from typer.testing import CliRunner

from corral.cli import app

from .conftest import Handler

BUILT = {"name": "tools", "version": 2, "image": "corral-template/tools:2", "image_id": "sha256:x", "cached": False}


def _ndjson(*items: dict[str, object]) -> httpx.Response:
    body = "".join(json.dumps(item) + "\n" for item in items)
    return httpx.Response(200, content=body.encode(), headers={"content-type": "application/x-ndjson"})


def test_build_sends_the_context_and_prints_progress(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    (tmp_path / "corral.template.yaml").write_text("apt: [make]\n")
    (tmp_path / "a.txt").write_text("A")
    seen = gateway(lambda request: _ndjson({"progress": "Step 1/2 : FROM sha256:base"}, {"template": BUILT}))
    args = ["template", "build", "tools", "-f", str(tmp_path / "corral.template.yaml"), "--context", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Step 1/2" in result.stderr and "tools:2 corral-template/tools:2" in result.stdout
    [request] = seen
    assert request.url.path == "/v1/templates" and dict(request.url.params) == {
        "name": "tools",
        "file": "corral.template.yaml",
    }
    with tarfile.open(fileobj=io.BytesIO(request.content)) as archive:
        assert sorted(archive.getnames()) == ["a.txt", "corral.template.yaml"]


def test_a_failed_build_is_a_clean_failure_with_its_step_and_output(
    gateway: Callable[[Handler], list[httpx.Request]], tmp_path: Path
) -> None:
    (tmp_path / "t.yaml").write_text("apt: [nope]\n")
    error = {"code": "template_build_failed", "message": "failed", "step": "Step 2/2 : RUN apt", "output": "E: Unable"}
    gateway(lambda request: _ndjson({"progress": "Step 2/2 : RUN apt"}, {"error": error}))
    result = CliRunner().invoke(app, ["template", "build", "tools", "-f", str(tmp_path / "t.yaml")])
    assert result.exit_code == 1
    assert "template_build_failed" in result.stderr and "E: Unable" in result.stderr


def test_list_and_rm(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    listing = [
        {"name": "tools", "latest": 2, "mine": True, "versions": [{"version": 2, "image": "i", "size": 1 << 21}]}
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=listing) if request.method == "GET" else httpx.Response(204)

    seen = gateway(handler)
    listed = CliRunner().invoke(app, ["template", "list"])
    assert listed.exit_code == 0 and "tools" in listed.stdout and "2 MiB" in listed.stdout
    removed = CliRunner().invoke(app, ["template", "rm", "tools:2"])
    assert removed.exit_code == 0, removed.output
    assert (seen[-1].method, seen[-1].url.path, dict(seen[-1].url.params)) == (
        "DELETE",
        "/v1/templates/tools",
        {"version": "2"},
    )
