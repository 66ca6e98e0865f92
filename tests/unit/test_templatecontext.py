"""A template's context packed on the client side: the file's place, links refused, the cap."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from corral.errors import InvalidRequest
from corral.templatecontext import pack


def _names(packed: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        return archive.getnames()


def test_a_file_inside_the_context_keeps_its_place(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tpl.yaml").write_text("apt: [make]\n")
    (tmp_path / "a.txt").write_text("A")
    packed, inside = pack(tmp_path / "sub" / "tpl.yaml", tmp_path)
    assert inside == "sub/tpl.yaml" and sorted(_names(packed)) == ["a.txt", "sub", "sub/tpl.yaml"]


def test_a_file_outside_goes_in_at_the_top_by_its_kind(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile.tools").write_text("FROM corral-desktop:latest\n")
    (tmp_path / "t.yaml").write_text("apt: [make]\n")
    assert pack(tmp_path / "Dockerfile.tools")[1] == "Dockerfile"
    packed, inside = pack(tmp_path / "t.yaml")
    assert inside == "corral.template.yaml" and _names(packed) == ["corral.template.yaml"]


def test_links_and_oversized_contexts_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("")
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "big").write_bytes(b"x" * 2048)
    with pytest.raises(InvalidRequest, match="over"):
        pack(tmp_path / "t.yaml", context, limit=1024)
    (context / "link").symlink_to("/etc/passwd")
    with pytest.raises(InvalidRequest, match="link"):
        pack(tmp_path / "t.yaml", context)
