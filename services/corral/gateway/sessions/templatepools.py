"""Templates on the session side: the check at start (:class:`TemplateResolver`, given a create's
``template``) and a warm pool per template named in ``CORRAL_POOL``, each a :class:`WarmPool` of its
template's newest checked image; a claim for template T takes from T's pool or starts cold from T's
image."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from corral.gateway.sessions.pool import WarmPool
from corral.gateway.templates.resolver import Resolved, TemplateResolver

log = logging.getLogger(__name__)


class TemplatePools:
    def __init__(
        self, resolver: TemplateResolver, sizes: Mapping[str, int], make: Callable[[Callable[[], str], int], WarmPool]
    ) -> None:
        self._resolver = resolver
        self._pools = {name: make(self._image_of(name), size) for name, size in sizes.items() if size > 0}

    def _image_of(self, name: str) -> Callable[[], str]:
        def image() -> str:
            return self._resolver.resolve(name).image_id  # the newest version; raises if gone or stale

        return image

    def resolve(self, template: str) -> Resolved:
        return self._resolver.resolve(template)

    def pool_for(self, template: str) -> WarmPool | None:
        """The pool of ``template``'s name (``NAME`` or ``NAME:VERSION``: the pool holds the newest
        version's sandboxes, and a claim takes one only when it asked for that image)."""
        return self._pools.get(template.partition(":")[0])

    def pools(self) -> list[WarmPool]:
        return list(self._pools.values())

    def __len__(self) -> int:
        return sum(len(pool) for pool in self._pools.values())

    @property
    def starting(self) -> int:
        return sum(pool.starting for pool in self._pools.values())

    def refill(self, name: str) -> None:
        """After a build or a delete of ``name``: its pool refills (dropping sandboxes of another version)."""
        pool = self._pools.get(name)
        if pool is not None:
            pool.refill()
