"""The warm pool: pairs started ahead (default viewport and resources, nothing allowed), refilled by
one kept loop, handed out to a claim after a last look, and taken out when the reaper finds one dead.
A pooled pair is never adopted by a restarted gateway (a used sandbox must never reach another key):
stopping removes them all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

from corral.errors import TemplateInvalid, TemplateNotFound, TemplateStale
from corral.gateway.models import CreateSession, Viewport
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import Pair
from corral.gateway.sessions.starts import Starts
from corral.gateway.threads import settle
from corral.runtime import ALIVE_STATES, State

log = logging.getLogger(__name__)
HAND_OUT_CHECK_S = 2.0  # the last look at a pooled sandbox before it is handed out
REFILL_RETRY_S = 5.0


def base_image() -> str | None:
    return None  # the base's own pool: the gateway's image


class WarmPool:
    """One image's pool: the base's, or a template's (``image_of`` gives the image its pairs start
    from now, a template's newest checked version; a pair of an older one is dropped at the refill)."""

    def __init__(
        self,
        size: int,
        mode: str,
        starts: Starts,
        egress: EgressPort,
        controllers: Controllers,
        image_of: Callable[[], str | None] = base_image,
    ) -> None:
        self._size, self._mode = size, mode  # the pool's pairs start with the gateway's default egress mode
        self._starts, self._egress, self._controllers = starts, egress, controllers
        self._image_of = image_of
        self._images: dict[str, str | None] = {}  # pooled session id -> the image it started from
        self._pairs: list[Pair] = []
        self._refill = asyncio.Event()
        self.starting = 0  # pairs being started by the refill
        self.filled = asyncio.Event()  # set whenever a refill left the pool full (tests and the bench wait on it)

    def __len__(self) -> int:
        return len(self._pairs)

    def pairs(self) -> list[Pair]:
        """The pooled pairs, oldest first (a copy)."""
        return list(self._pairs)

    def add(self, pair: Pair) -> None:
        """A started, ready pair joins the pool (as the refill leaves one)."""
        self._pairs.append(pair)

    def replace(self, old: Pair, new: Pair) -> None:
        self._pairs[self._pairs.index(old)] = new
        self._images[new.session_id] = self._images.pop(old.session_id, None)

    def refill(self) -> None:
        self._refill.set()

    @staticmethod
    def fits(req: CreateSession) -> bool:
        # A volume is mounted as its sandbox starts: a pooled sandbox started without one.
        return (
            req.viewport == Viewport()
            and req.resources.model_dump(exclude_none=True) == {}
            and req.hermetic is None
            and req.volume is None
        )

    def take(self, req: CreateSession, image: str | None = None) -> Pair | None:
        """The oldest pooled pair of ``image`` (None: the base), if one fits the request (the caller
        holds the claims' lock)."""
        if not self.fits(req):
            return None
        pair = next((p for p in self._pairs if self._images.get(p.session_id) == image), None)
        if pair is None:
            return None
        self.filled.clear()
        self._pairs.remove(pair)
        self._images.pop(pair.session_id, None)
        return pair

    def image_now(self) -> str | None:
        """The image the pool fills with now; raises (a template gone or stale) when there is none."""
        return self._image_of()

    async def run(self) -> None:
        """The refill loop: up to the pool's size, each time it is told to refill."""
        while True:
            await self._refill.wait()
            self._refill.clear()
            try:
                image = await asyncio.to_thread(self._image_of)
            except (TemplateNotFound, TemplateStale, TemplateInvalid) as exc:
                # A template named in CORRAL_POOL not built yet, deleted, or built on an older base: its
                # pool empties and waits for its next build (which refills it) rather than retry.
                log.warning("a template's pool stays empty: %s", exc)
                await self._drop(list(self._pairs), "is of no template now")
                continue
            # A new version (or a rebuilt base): the pairs of the image before go first.
            await self._drop([p for p in self._pairs if self._images.get(p.session_id) != image], "is stale")
            while len(self._pairs) + self.starting < self._size:
                self.starting += 1
                try:
                    pair = await self._starts.start("pool", Viewport(), None, [], self._mode, image=image)
                    self._images[pair.session_id] = image
                    self._pairs.append(pair)
                except Exception:
                    log.exception("could not start a pooled sandbox; retrying in %.0f s", REFILL_RETRY_S)
                    await asyncio.sleep(REFILL_RETRY_S)
                finally:
                    self.starting -= 1
            self.filled.set()

    async def close(self) -> None:
        """Remove every pooled pair (after the refill loop was cancelled)."""
        pool, self._pairs = self._pairs, []
        self.filled.clear()
        await settle(*(asyncio.ensure_future(self._starts.remove(pair)) for pair in pool))

    async def hand_out(self, pair: Pair, allow: Sequence[str], mode: str, actor: str) -> bool:
        """The last look at a pooled pair, and its policy, side by side: its controller answers, and
        the session's policy set on its proxy (it starts with nothing allowed), whose answer is
        the proxy's own proof of life, each bounded by HAND_OUT_CHECK_S. True once both hold: the
        policy is in force. A pair that fails either (it died while waiting, or hangs) is removed,
        never handed out: False, and the pool refills."""
        checks: list[Awaitable[object]] = [self._controllers.answers(pair.sandbox, HAND_OUT_CHECK_S)]
        if pair.egress is not None:
            # Bounded like the controller's look (the control call's own bound is 5 s): a proxy that
            # hangs fails the pair, and the claim goes cold at once rather than wait on it.
            policy = self._egress.set_policy(pair.egress, list(allow), mode, actor)
            checks.append(_within(policy, HAND_OUT_CHECK_S))
        results, cancelled = await settle(*checks)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is None and not cancelled:
            return True
        if not cancelled:
            log.warning(
                "pooled sandbox %s is not healthy (%s); removing it and starting one", pair.sandbox.name, failure
            )
        self._refill.set()
        await settle(asyncio.ensure_future(self._starts.remove(pair)))
        if cancelled:
            raise asyncio.CancelledError
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # a KeyboardInterrupt, a SystemExit: not the pair's fault, not to be swallowed
        return False

    async def check(
        self,
        pooled: Sequence[Pair],
        states: Mapping[str, State],
        proxies: Mapping[str, State],
        closed_nodes: Collection[str] = (),
    ) -> None:
        """The ``pooled`` pairs whose sandbox (from the reaper's listing, ``states``) or proxy (its
        listing, ``proxies``, by session) stopped running leave the pool ahead of any claim, and the
        pool refills: a claim then rarely meets a dead one (its own last look, :meth:`hand_out`,
        still stands behind this). So do the ones on a machine that takes no new sessions
        (``closed_nodes``: paused, drained, down): a session claimed from the pool is a new session
        there, and the refill's start lands where the runtime places it, on a machine that does."""
        taken = [pair for pair in pooled if pair in self._pairs]  # a claim may have taken one meanwhile
        dead = [
            pair
            for pair in taken
            if states.get(pair.sandbox.id) not in ALIVE_STATES
            or (pair.egress is not None and proxies.get(pair.session_id) != "running")
        ]
        await self._drop(dead, "stopped running")
        closed = [pair for pair in taken if pair not in dead and pair.sandbox.node in closed_nodes]
        await self._drop(closed, "is on a node that takes no new sessions")

    async def check_answers(self) -> None:
        """Every pooled sandbox's controller answers (the claim's own look, all at once); one that
        does not leaves the pool and is removed, and the pool refills."""
        pooled = list(self._pairs)
        looks = (self._controllers.answers(pair.sandbox, HAND_OUT_CHECK_S) for pair in pooled)
        results = await asyncio.gather(*looks, return_exceptions=True)
        dead = [pair for pair, result in zip(pooled, results, strict=True) if isinstance(result, Exception)]
        dead = [pair for pair in dead if pair in self._pairs]  # a claim may have taken it meanwhile
        await self._drop(dead, "does not answer")

    async def _drop(self, dead: Sequence[Pair], why: str) -> None:
        """Pooled pairs out of the pool and removed; the pool refills."""
        for pair in dead:
            self.filled.clear()
            self._pairs.remove(pair)
            self._images.pop(pair.session_id, None)
            log.warning("pooled sandbox %s %s; removing it and starting one", pair.sandbox.name, why)
        if dead:
            self._refill.set()
            _, cancelled = await settle(*(asyncio.ensure_future(self._starts.remove(pair)) for pair in dead))
            if cancelled:
                # A stop came while the removals ran: they are done, and the reaper ends with the stop
                # (swallowed here, the cancellation left the loop ticking and the stop waiting on it).
                raise asyncio.CancelledError


async def _within(work: Awaitable[object], seconds: float) -> object:
    """``work``'s result, or TimeoutError past ``seconds`` (asyncio.timeout, not wait_for: pyproject's
    ruff ban says why)."""
    async with asyncio.timeout(seconds):
        return await work
