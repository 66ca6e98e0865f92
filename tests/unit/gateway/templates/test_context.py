"""The build context read without extracting it, and the engine's context written anew."""

from __future__ import annotations

import io
import tarfile

import pytest

from corral.errors import TemplateInvalid
from corral.gateway.templates.context import Member, read_context, write_context


def _tar(*members: tuple[str, bytes | None, int], link: str | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, mode
                archive.addfile(info)
            else:
                info.size, info.mode = len(data), mode
                archive.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo("evil")
            info.type, info.linkname = tarfile.SYMTYPE, link
            archive.addfile(info)
    return out.getvalue()


def test_a_context_is_read_with_its_template_and_its_files() -> None:
    upload = _tar(("corral.template.yaml", b"apt: [make]\n", 0o644), ("./d", None, 0o755), ("d/a", b"A", 0o640))
    context = read_context(upload)
    assert context.template == "corral.template.yaml" and context.template_text == b"apt: [make]\n"
    assert context.under("d") == {"d/a": Member(b"A", 0o640)} and context.dirs == {"d"}
    assert read_context(upload).digest() == context.digest()
    changed = _tar(("corral.template.yaml", b"apt: [make]\n", 0o644), ("d/a", b"B", 0o640))
    assert read_context(changed).digest() != context.digest()


@pytest.mark.parametrize(
    "upload",
    [
        _tar(("corral.template.yaml", b"", 0o644), link="/etc/shadow"),
        _tar(("corral.template.yaml", b"", 0o644), ("../up", b"x", 0o644)),
        _tar(("corral.template.yaml", b"", 0o644), ("/abs", b"x", 0o644)),
        _tar(("corral.template.yaml", b"", 0o644), (".corral-template/x", b"x", 0o644)),
        _tar(("other", b"", 0o644)),  # no template file
        b"not a tar at all",
    ],
)
def test_what_a_context_may_not_hold_is_refused(upload: bytes) -> None:
    with pytest.raises(TemplateInvalid):
        read_context(upload)


def test_the_engines_context_drops_setuid_bits_and_owners() -> None:
    written = write_context("FROM x\n", {"files/a": Member(b"A", 0o4755 & 0o777)}, {"w/x.whl": b"W"})
    with tarfile.open(fileobj=io.BytesIO(written)) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert set(members) == {"Dockerfile", "files/a", "w/x.whl"}
    assert members["files/a"].mode == 0o755 and members["files/a"].uid == 0


def test_a_context_file_named_dockerfile_cannot_replace_the_generated_one() -> None:
    """A Dockerfile template chosen by another name (``file``) with a root ``Dockerfile`` beside it:
    the engine's context held the generated Dockerfile, then the client's under the same name, and an
    archive's later member wins, so the build ran the client's unchecked lines (any FROM, stages
    copying from any image on the host). Refused (review of issue 29)."""
    from corral.gateway.templates.dockerfile import dockerfile_stage
    from corral.gateway.templates.spec import TemplateSpec, parse_template

    raw = b"FROM corral-desktop:latest\nRUN true\n"
    evil = b"FROM corral-egress:latest AS loot\nFROM corral-desktop:latest\nCOPY --from=loot / /loot\n"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in (("build.dockerfile", raw), ("Dockerfile", evil)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    context = read_context(out.getvalue(), "build.dockerfile")
    template = parse_template(context.template, context.template_text)
    assert not isinstance(template, TemplateSpec)
    files = {p: m for p, m in context.files.items() if p != context.template}
    with pytest.raises(TemplateInvalid) as refused:
        write_context(dockerfile_stage(template, "sha256:base"), files)
    assert refused.value.field == "context" and "Dockerfile" in str(refused.value)
    assert write_context("FROM x\n", {"files/Dockerfile": Member(evil, 0o644)})  # a YAML template's file: no clash


def test_a_compressed_context_is_bounded_as_it_unpacks_not_only_as_it_came() -> None:
    """A gzip of zeros is a few KiB on the wire and any size in memory: the route's cap is on the
    upload, so the context's files together are capped as they are read (review of issue 29)."""
    import gzip

    big = io.BytesIO()
    with tarfile.open(fileobj=big, mode="w") as archive:
        for name, size in (("corral.template.yaml", 0), ("zeros", 8 << 20)):
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, io.BytesIO(bytes(size)))
    upload = gzip.compress(big.getvalue())
    assert len(upload) < 64 << 10
    with pytest.raises(TemplateInvalid) as refused:
        read_context(upload, None, max_bytes=1 << 20)
    assert refused.value.field == "context" and "1 MiB" in str(refused.value)
    assert read_context(upload, None, max_bytes=16 << 20).files["zeros"].data == bytes(8 << 20)
