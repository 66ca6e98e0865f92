"""A template at a session's start: the check at start, cheap (design record 0320). The image a
session starts from is the one the gateway recorded when its build passed the check (by id: a tag
moved under the name later is never believed), and it stands on the current base's layers (a
template built on an older base is refused: rebuild it). One catalog read and two inspects."""

from __future__ import annotations

from dataclasses import dataclass

from corral.errors import TemplateNotFound, TemplateStale
from corral.gateway.templates.catalog import TemplateCatalog
from corral.gateway.templates.check import on_base
from corral.gateway.templates.spec import parse_ref
from corral.runtime import SandboxRuntime


@dataclass(frozen=True, slots=True)
class Resolved:
    """A template a session may start from: ``NAME:VERSION`` and its checked image's id."""

    ref: str
    image_id: str


class TemplateResolver:
    def __init__(self, runtime: SandboxRuntime, catalog: TemplateCatalog, base_image: str) -> None:
        self._runtime, self._catalog, self._base_image = runtime, catalog, base_image

    def resolve(self, text: str) -> Resolved:
        """``NAME`` (its newest version) or ``NAME:VERSION``, checked for a start; TemplateNotFound
        naming it, or TemplateStale when its base is not the gateway's now."""
        ref = parse_ref(text)
        record, version = self._catalog.resolve(ref)
        shown = f"{record.name}:{version.version}"
        image = self._runtime.image_info(version.image_id)
        if image is None:
            raise TemplateNotFound(f"template {shown}'s image is gone from the engine: rebuild it")
        base = self._runtime.image_info(self._base_image)
        if base is None or not on_base(base, image):
            raise TemplateStale(f"template {shown} was built on an older base than {self._base_image}: rebuild it")
        return Resolved(shown, image.id)
