"""A template's build, whole: the context read, the template parsed, the cache asked, packages
fetched on the host, the first stage built (the template's own), its configuration judged, the
finishing stage built (environment file, seed), the result checked (:mod:`.check`), then tagged
``corral-template/NAME:N`` and ``corral-template/NAME:latest`` and recorded. Nothing is recorded or
tagged before the check passed; a failure or a refusal removes every image the build made. One
build at a time (the engine and the host's cores are shared with the sessions). Blocking: the
route runs it in a thread and streams its progress lines as they come."""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from corral.errors import SandboxError, TemplateBuildFailed, TemplateNotFound, TemplateRefused
from corral.gateway.templates import check, ldcache
from corral.gateway.templates.catalog import TemplateCatalog, TemplateRecord, TemplateVersion, image_reference, now
from corral.gateway.templates.context import MAX_BYTES as MAX_CONTEXT_BYTES
from corral.gateway.templates.context import Context, Member, read_context, write_context
from corral.gateway.templates.dockerfile import (
    ENV_FILE,
    FILES,
    NPM_CACHE,
    WHEELS,
    dockerfile_stage,
    env_file,
    finish_stage,
    first_stage,
)
from corral.gateway.templates.fetch import fetch_npm, fetch_wheels
from corral.gateway.templates.libraries import (
    Libraries,
    base_libraries,
    digests_of,
    first_files,
    image_digests,
    read_cache,
)
from corral.gateway.templates.spec import DockerfileTemplate, TemplateSpec, check_name, parse_template
from corral.runtime import ImageInfo, SandboxRuntime

log = logging.getLogger(__name__)

Sink = Callable[[str], None]
FORMAT = "1"  # of what the build generates: a change of it is a change of every cache key
BUILD_REPOSITORY = "corral-template-build"  # a build's images until the check passed
USERS_FILES = ("/etc/passwd", "/etc/group")
MAX_USERS_FILE = 1 << 20


@dataclass(frozen=True, slots=True)
class BaseFacts:
    """What the check compares a template with, read once per base image."""

    digests: dict[str, str]
    setuid: list[str]
    passwd: str
    group: str
    libraries: Libraries  # what the loader gives the base's programs (templates.libraries)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A build asked for, read and parsed (what is wrong with it is said before a build starts)."""

    owner: str
    name: str
    context: Context
    template: TemplateSpec | DockerfileTemplate


@dataclass(frozen=True, slots=True)
class Built:
    version: TemplateVersion
    cached: bool  # the same template, context and base gave this version back without a build


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


class TemplateBuilder:
    def __init__(
        self,
        runtime: SandboxRuntime,
        catalog: TemplateCatalog,
        base_image: str,
        network: str,
        context_max_bytes: int = MAX_CONTEXT_BYTES,
    ) -> None:
        self._runtime, self._catalog, self._base_image = runtime, catalog, base_image
        self._context_max_bytes = context_max_bytes  # unpacked, as the upload's cap is packed
        self._network = network  # where the RUN steps run: the sandboxes' shared network (guarded, no icc)
        self._lock = threading.Lock()
        self._facts: dict[str, BaseFacts] = {}

    def base(self) -> ImageInfo:
        base = self._runtime.image_info(self._base_image)
        if base is None:
            raise TemplateBuildFailed(f"the base image {self._base_image} is not built: `corral images build`")
        return base

    def prepare(self, owner: str, name: str, upload: bytes, file: str | None) -> Prepared:
        """The context read and the template parsed; TemplateInvalid, TemplateRefused, or
        TemplateNotFound for a name another key built (absent to this one)."""
        check_name(name)
        self._catalog.owned(name, owner)
        context = read_context(upload, file, self._context_max_bytes)
        template = parse_template(context.template, context.template_text)
        if isinstance(template, DockerfileTemplate):  # said before a build starts (write_context refuses it too)
            write_context("", {p: m for p, m in context.files.items() if p != context.template})
        return Prepared(owner, name, context, template)

    def build(self, prepared: Prepared, sink: Sink) -> Built:
        owner, name, context, template = prepared.owner, prepared.name, prepared.context, prepared.template
        with self._lock:
            self._catalog.owned(name, owner)  # again: another key may have built it meanwhile
            base = self.base()
            key = hashlib.sha256(f"{FORMAT}\0{base.id}\0{context.template}\0{context.digest()}".encode()).hexdigest()
            cached = self._cached(name, key)
            if cached is not None:
                sink(f"cached: {name}:{cached.version} (the same template, context and base)")
                return Built(cached, True)
            version = self._catalog.next_version(name)
            made = self._build(owner, name, version, template, context, base, sink)
            record = TemplateVersion(
                version=version,
                image_id=made.id,
                base_id=base.id,
                cache_key=key,
                env=json.loads(made.labels.get("corral.template.env", "{}")),
                size=made.size,
                created_at=now(),
            )
            self._catalog.add(name, owner, record)
            sink(f"built {name}:{version}")
            return Built(record, False)

    def listing(self) -> list[TemplateRecord]:
        return self._catalog.all()

    def show(self, name: str) -> TemplateRecord:
        record = self._catalog.get(check_name(name))
        if record is None or not record.versions:
            raise TemplateNotFound(f"no template {name}")
        return record

    def delete(self, owner: str, name: str, version: int | None) -> None:
        """All of ``name``'s versions, or ``version``; its builder's key only (to another: absent). An image
        a session still runs from stays with the engine until that session ends; no start finds it."""
        with self._lock:
            record = self._catalog.owned(check_name(name), owner)
            if record is None or (version is not None and record.version(version) is None):
                raise TemplateNotFound(f"no template {name}" + (f":{version}" if version is not None else ""))
            left = self._catalog.drop(name, version)
            gone = [v for v in record.versions if left is None or v not in left.versions]
            for old in gone:
                self._forget(image_reference(name, old.version))
            if left is None:
                self._forget(image_reference(name))
            else:
                self._runtime.tag_image(left.latest.image_id, image_reference(name))

    def _forget(self, reference: str) -> None:
        try:
            self._runtime.remove_image(reference)
        except SandboxError as exc:  # a session still runs from it: it goes with the next delete or by hand
            log.warning("template image %s kept: %s", reference, exc)

    def _cached(self, name: str, key: str) -> TemplateVersion | None:
        record = self._catalog.get(name)
        if record is None or not record.versions or record.latest.cache_key != key:
            return None
        image = self._runtime.image_info(record.latest.image_id)
        return record.latest if image is not None else None

    def _build(
        self,
        owner: str,
        name: str,
        version: int,
        template: TemplateSpec | DockerfileTemplate,
        context: Context,
        base: ImageInfo,
        sink: Sink,
    ) -> ImageInfo:
        token = secrets.token_hex(4)
        first_tag, final_tag = f"{BUILD_REPOSITORY}/{name}:{token}-1", f"{BUILD_REPOSITORY}/{name}:{token}-2"
        try:
            sink("step 1/3: the template's own layers")
            first = self._first(template, context, base, first_tag, sink)
            refusals = check.config_refusals(base, first)
            if refusals:
                raise TemplateRefused(f"template {name} refused: " + "; ".join(refusals))
            env = template.env if isinstance(template, TemplateSpec) else check.added_env(base.env, first.env)
            labels = {
                "corral.template": name,
                "corral.template.version": str(version),
                "corral.template.owner": owner,
                "corral.template.env": json.dumps(env, sort_keys=True),
            }
            sink("step 2/3: environment and seed")
            finish = write_context(finish_stage(first.id), {}, {ENV_FILE: env_file(env)})
            final_id = self._runtime.build_image(finish, final_tag, labels, sink, first.id, self._network)
            sink("step 3/3: checking what the template changed")
            final = self._checked(name, base, final_id)
            self._runtime.tag_image(final.id, image_reference(name, version))
            self._runtime.tag_image(final.id, image_reference(name))
            return final
        except BaseException:
            self._runtime.remove_image(final_tag)  # its parents, untagged, go with it
            raise
        finally:
            self._runtime.remove_image(first_tag)
            self._runtime.remove_image(final_tag)  # the image stays under its version's name

    def _first(
        self, template: TemplateSpec | DockerfileTemplate, context: Context, base: ImageInfo, tag: str, sink: Sink
    ) -> ImageInfo:
        files = {path: member for path, member in context.files.items() if path != context.template}
        if isinstance(template, TemplateSpec):
            extra: dict[str, bytes] = {}
            if template.pip:
                extra |= fetch_wheels(template.pip, platform.machine(), WHEELS, sink)
            if template.npm:
                extra |= fetch_npm(template.npm, NPM_CACHE, sink)
            wanted: dict[str, Member] = {}
            for item in template.files:
                wanted |= {f"{FILES}/{path}": member for path, member in context.under(item.src).items()}
            dockerfile = first_stage(template, base.id, context.dirs, bool(template.pip), bool(template.npm))
            built = write_context(dockerfile, wanted, extra)
        else:
            built = write_context(dockerfile_stage(template, base.id), files)
        image_id = self._runtime.build_image(built, tag, {}, sink, base.id, self._network)
        info = self._runtime.image_info(image_id)
        if info is None:
            raise TemplateBuildFailed("the built image vanished", step="build")
        return info

    def _checked(self, name: str, base: ImageInfo, image_id: str) -> ImageInfo:
        image = self._runtime.image_info(image_id)
        if image is None:
            raise TemplateBuildFailed("the built image vanished", step="check")
        facts = self._base_facts(base)
        refusals = check.config_refusals(base, image)
        if not check.on_base(base, image):
            refusals.append("it is not built on the base's layers")
        refusals += check.path_refusals(facts.digests, self._checked_digests(image.id))
        users = self._runtime.read_files(image.id, USERS_FILES, MAX_USERS_FILE)
        refusals += check.users_refusals(
            facts.passwd, _text(users["/etc/passwd"]), facts.group, _text(users["/etc/group"])
        )
        refusals += check.setuid_refusals(facts.setuid, self._runtime.setuid_files(image.id))
        refusals += self._loader_refusals(facts, image.id)
        if refusals:
            raise TemplateRefused(f"template {name} refused: " + "; ".join(refusals))
        return image

    def _checked_digests(self, image_id: str) -> dict[str, str]:
        """The checked paths' digests, and the directories on the way to them by their own entries."""
        parents = digests_of(self._runtime.path_entries(image_id, check.CHECKED_PARENTS))
        return {**self._runtime.path_digests(image_id, check.CHECKED), **parents}

    def _loader_refusals(self, facts: BaseFacts, image_id: str) -> list[str]:
        """No soname of the base's resolving to another file, and none of those files (nor the links
        to them, nor the loader) changed: a library the template adds under another name is its own."""
        try:
            cache = read_cache(self._runtime, image_id)
        except ValueError as exc:
            return [f"its loader cache cannot be read ({exc})"]
        refusals = ldcache.shadowed(facts.libraries.sonames, first_files(cache))
        refusals += ldcache.changed(facts.libraries.cache, cache)
        digests = image_digests(self._runtime, image_id, facts.libraries)
        return refusals + check.path_refusals(facts.libraries.digests, digests)

    def _base_facts(self, base: ImageInfo) -> BaseFacts:
        facts = self._facts.get(base.id)
        if facts is None:
            users = self._runtime.read_files(base.id, USERS_FILES, MAX_USERS_FILE)
            try:
                libraries = base_libraries(self._runtime, base.id)
            except ValueError as exc:
                raise TemplateBuildFailed(f"the base's loader cache cannot be read: {exc}", step="check") from None
            facts = BaseFacts(
                self._checked_digests(base.id),
                self._runtime.setuid_files(base.id),
                _text(users["/etc/passwd"]),
                _text(users["/etc/group"]),
                libraries,
            )
            self._facts = {base.id: facts}  # one base at a time: an older one's facts go
        return facts
