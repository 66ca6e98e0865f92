"""A template's build against the fake runtime: versions, the cache, refusals leaving nothing, owners."""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from corral.errors import TemplateBuildFailed, TemplateNotFound, TemplateRefused, TemplateStale
from corral.gateway.templates.builder import TemplateBuilder
from corral.gateway.templates.catalog import TemplateCatalog, image_reference
from corral.gateway.templates.resolver import TemplateResolver
from corral.runtime import ImageInfo

from ...runtime.fake import FakeRuntime
from ...runtime.ldcachefile import cache

BASE = "corral-desktop:test"
LD_CACHE = "/etc/ld.so.cache"
LIBC, LIBZ = "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libz.so.1"
BASE_LD_CACHE = cache([("libc.so.6", LIBC), ("libz.so.1", LIBZ)])
PASSWD = b"root:x:0:0::/root:/bin/sh\nagent:x:1100:1100::/home/agent:/bin/sh\n"


def _runtime() -> FakeRuntime:
    fake = FakeRuntime()
    base = ImageInfo("sha256:base", ("a",), ("python",), None, "root", ("CMD", "x"), ("PATH=/usr/bin",), (), {}, 10)
    fake.images[BASE] = fake.images[base.id] = base
    fake.base_files = {"/etc/passwd": PASSWD, "/etc/group": b"agent:x:1100:browser\n", LD_CACHE: BASE_LD_CACHE}
    fake.links = {"/lib/x86_64-linux-gnu/libz.so.1": "libz.so.1.2.13", "/lib": "usr/lib"}
    return fake


def _upload(template: bytes, name: str = "corral.template.yaml", **files: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for path, data in {name: template, **files}.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _build(builder: TemplateBuilder, upload: bytes, owner: str = "key1", name: str = "tools") -> tuple[int, bool]:
    lines: list[str] = []
    built = builder.build(builder.prepare(owner, name, upload, None), lines.append)
    assert lines  # progress as it went
    return built.version.version, built.cached


def test_versions_the_cache_and_the_newest_name(tmp_path: Path) -> None:
    fake = _runtime()
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path), BASE, "corral-sandboxes")
    upload = _upload(b"apt: [make]\nfiles: [{src: a, dest: /usr/local/share/a}]\nenv: {X: y}\n", a=b"A")
    assert _build(builder, upload) == (1, False)
    assert len(fake.builds) == 2  # the template's stage and the finishing one
    assert "apt-get install -y --no-install-recommends make" in fake.builds[0]
    assert _build(builder, upload) == (1, True) and len(fake.builds) == 2  # cached: no build
    assert _build(builder, _upload(b"apt: [make]\nfiles: [{src: a, dest: /usr/local/share/a}]\n", a=b"B")) == (2, False)
    record = builder.show("tools")
    assert [v.version for v in record.versions] == [1, 2] and record.versions[0].env == {"X": "y"}
    assert fake.images[image_reference("tools")].id == record.latest.image_id
    assert fake.images[image_reference("tools", 1)].id == record.versions[0].image_id


def _refused_by(fake: FakeRuntime, **change: object) -> None:
    def build(dockerfile: str, image: ImageInfo) -> ImageInfo:
        return replace(image, **change) if dockerfile.startswith("FROM sha256:img") else image  # type: ignore[arg-type]

    fake.on_build = build


@pytest.mark.parametrize(
    ("steer", "reason"),
    [
        ("setuid", "setuid or setgid file /usr/local/bin/x"),
        ("opt", "changes /opt/corral"),
        # /opt a link to a copy: /opt/corral reads the same through it; /opt's own entry does not.
        ("opt-link", "changes /opt,"),
        ("entrypoint", "changes ENTRYPOINT"),
        ("passwd", "changes the user agent"),
    ],
)
def test_a_weakening_template_is_refused_and_nothing_of_it_stays(tmp_path: Path, steer: str, reason: str) -> None:
    fake = _runtime()
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path), BASE, "corral-sandboxes")
    made: list[str] = []

    def build(dockerfile: str, image: ImageInfo) -> ImageInfo:
        made.append(image.id)
        final = "template-env.json" in dockerfile
        if steer == "setuid" and final:
            fake.setuid[image.id] = ["/usr/local/bin/x"]
        if steer == "opt" and final:
            fake.digests[image.id] = {"/opt/corral": "changed"}
        if steer == "opt-link" and final:
            fake.digests[image.id] = {"/opt": "a link"}
        if steer == "passwd" and final:
            fake.files[image.id] = {"/etc/passwd": PASSWD.replace(b"1100:1100", b"0:0")}
        return replace(image, entrypoint=("sh",)) if steer == "entrypoint" else image

    fake.on_build = build
    with pytest.raises(TemplateRefused, match=reason):
        _build(builder, _upload(b"setup: 'true'\n"))
    assert TemplateCatalog(tmp_path).get("tools") is None
    assert not any(ref.startswith("corral-template") for ref in fake.images)  # no tag, build or final
    assert not any(image in fake.images for image in made)


def test_a_failed_build_says_its_step_and_keeps_nothing(tmp_path: Path) -> None:
    fake = _runtime()

    def fail(dockerfile: str, image: ImageInfo) -> ImageInfo:
        raise TemplateBuildFailed(
            "Step 2/2 : RUN ...: exit 100", step="Step 2/2 : RUN", output="E: Unable to locate package nope"
        )

    fake.on_build = fail
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path), BASE, "corral-sandboxes")
    with pytest.raises(TemplateBuildFailed) as caught:
        _build(builder, _upload(b"apt: [nope]\n"))
    assert "Unable to locate package" in caught.value.output
    assert TemplateCatalog(tmp_path).get("tools") is None


def test_only_its_builder_rebuilds_or_deletes_and_any_key_uses_it(tmp_path: Path) -> None:
    fake = _runtime()
    catalog = TemplateCatalog(tmp_path)
    builder = TemplateBuilder(fake, catalog, BASE, "corral-sandboxes")
    _build(builder, _upload(b"apt: [make]\n"))
    with pytest.raises(TemplateNotFound):
        builder.prepare("key2", "tools", _upload(b"apt: [gcc]\n"), None)
    with pytest.raises(TemplateNotFound):
        builder.delete("key2", "tools", None)
    resolver = TemplateResolver(fake, catalog, BASE)
    assert resolver.resolve("tools").ref == "tools:1"  # any key starts from it
    _build(builder, _upload(b"apt: [gcc]\n"))
    builder.delete("key1", "tools", 2)
    assert resolver.resolve("tools").ref == "tools:1"
    assert fake.images[image_reference("tools")].id == catalog.get("tools").latest.image_id  # type: ignore[union-attr]
    builder.delete("key1", "tools", None)
    with pytest.raises(TemplateNotFound, match="no template tools"):
        resolver.resolve("tools")
    assert image_reference("tools") not in fake.images


def test_a_start_believes_the_recorded_image_on_the_current_base_only(tmp_path: Path) -> None:
    fake = _runtime()
    catalog = TemplateCatalog(tmp_path)
    _build(TemplateBuilder(fake, catalog, BASE, "corral-sandboxes"), _upload(b"apt: [make]\n"))
    resolver = TemplateResolver(fake, catalog, BASE)
    assert resolver.resolve("tools:1").image_id == catalog.get("tools").latest.image_id  # type: ignore[union-attr]
    with pytest.raises(TemplateNotFound, match="tools:2"):
        resolver.resolve("tools:2")
    fake.images[BASE] = replace(fake.images[BASE], id="sha256:rebuilt", layers=("z",))
    with pytest.raises(TemplateStale, match="rebuild it"):
        resolver.resolve("tools")


def test_a_dockerfile_template_is_built_on_the_base_id_and_its_env_kept(tmp_path: Path) -> None:
    fake = _runtime()

    def build(dockerfile: str, image: ImageInfo) -> ImageInfo:
        return replace(image, env=(*image.env, "TOOL_HOME=/opt/tool")) if "ENV TOOL_HOME" in dockerfile else image

    fake.on_build = build
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path), BASE, "corral-sandboxes")
    upload = _upload(b"FROM corral-desktop:latest\nENV TOOL_HOME=/opt/tool\n", name="Dockerfile")
    built = builder.build(builder.prepare("key1", "df", upload, None), lambda line: None)
    assert fake.builds[0].startswith("FROM sha256:base\n") and built.version.env == {"TOOL_HOME": "/opt/tool"}


def _with_cache(tmp_path: Path, data: bytes) -> tuple[FakeRuntime, TemplateBuilder]:
    """A builder whose template's image has ``data`` for its loader cache."""
    fake = _runtime()
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path), BASE, "corral-sandboxes")

    def with_cache(dockerfile: str, made: ImageInfo) -> ImageInfo:
        fake.files[made.id] = {LD_CACHE: data}
        return made

    fake.on_build = with_cache
    return fake, builder


def test_a_library_that_would_stand_in_for_the_bases_is_refused(tmp_path: Path) -> None:
    """What the boot's Python (root) and the supervisor's children load is the base's: no soname of
    the base's resolving elsewhere (a library in /usr/local/lib and an ldconfig), none of those files
    changed, nor the file behind a link to one (libz.so.1 -> libz.so.1.2.13)."""
    upload = _upload(b"apt: [make]\n")
    shadowing = cache([("libc.so.6", "/usr/local/lib/libc.so.6"), ("libc.so.6", LIBC), ("libz.so.1", LIBZ)])
    _, builder = _with_cache(tmp_path / "1", shadowing)
    with pytest.raises(TemplateRefused, match=re.escape("libc.so.6 from /usr/local/lib/libc.so.6")):
        _build(builder, upload)

    fake = _runtime()
    builder = TemplateBuilder(fake, TemplateCatalog(tmp_path / "2"), BASE, "corral-sandboxes")

    def replace_behind_the_link(dockerfile: str, made: ImageInfo) -> ImageInfo:
        fake.digests[made.id] = {"/lib/x86_64-linux-gnu/libz.so.1.2.13": "another"}
        return made

    fake.on_build = replace_behind_the_link
    with pytest.raises(TemplateRefused, match=re.escape("libz.so.1.2.13, which is the base's")):
        _build(builder, upload)

    adding = cache([("libc.so.6", LIBC), ("libz.so.1", LIBZ), ("libtool.so.1", "/usr/local/lib/libtool.so.1")])
    _, builder = _with_cache(tmp_path / "3", adding)
    assert _build(builder, upload) == (1, False)  # a library of its own, under its own name: fine

    # The base's file first, but for another architecture (flags an x86-64 loader skips), then the
    # template's: the loader takes the template's. The first file alone would look like the base's.
    skipped = cache([("libc.so.6", LIBC), ("libz.so.1", LIBZ), ("libz.so.1", "/usr/local/lib/libz.so.1")], {1: 0x3})
    _, builder = _with_cache(tmp_path / "4", skipped)
    with pytest.raises(TemplateRefused, match=re.escape("changes the loader cache's entries for libz.so.1")):
        _build(builder, upload)
