"""The one place where a request becomes a reply: every ActionError turns into a failure reply here."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from corral.errors import ActionError, ErrorCode
from corral.protocol import reply
from corral.protocol.envelope import Limits, decode, plan_request, request_id_of
from corral.protocol.plan import EncodedImage, Plan, RequestId, StepResult
from corral.sandbox.desktop import Desktop
from corral.sandbox.egress import ActionReporter

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(self, desktop: Desktop, limits: Limits, reporter: ActionReporter | None = None) -> None:
        self._desktop = desktop
        self._limits = limits
        self._reporter = reporter  # tells the egress proxy which action is in flight
        self._seq = 0
        # Ids stay unique in the session's audit log across controller restarts.
        self._boot = secrets.token_hex(2)

    async def handle(self, raw: str | bytes) -> dict[str, Any]:
        """One message in, one reply out; never raises for anything the client sent."""
        started = time.perf_counter()
        request_id: RequestId = None
        try:
            obj = decode(raw, self._limits)
            request_id = request_id_of(obj)
            plan = plan_request(obj, self._desktop.size, self._limits)
            self._seq += 1
            action_id = f"a{self._seq}.{self._boot}"
            try:
                async with asyncio.timeout(plan.timeout_ms / 1000):
                    async with self._desktop.lock:
                        if self._reporter is not None:
                            await self._reporter.started(action_id)
                        try:
                            results, image = await self._execute(plan)
                        finally:
                            if self._reporter is not None:
                                await self._reporter.ended(action_id)
            except TimeoutError:
                raise ActionError(
                    ErrorCode.TIMEOUT, f"the request did not finish within {plan.timeout_ms} ms", field="timeout_ms"
                ) from None
            out = reply.success(plan, results, image, (time.perf_counter() - started) * 1000)
            out["action_id"] = action_id  # what the egress audit log calls this action
            return out
        except ActionError as exc:
            # The client's mistake or a refused action: worth a line, not a traceback.
            log.info("request %r failed: %s %s (%s)", request_id, exc.code, exc.message, exc.field)
            return reply.failure(request_id, exc)
        except Exception:
            log.exception("internal error handling request %r", request_id)
            return reply.failure(request_id, ActionError(ErrorCode.INTERNAL, "internal error; see the controller log"))

    def refuse(self, error: ActionError, request_id: RequestId = None) -> dict[str, Any]:
        """The failure reply for a message refused before it could be read."""
        log.info("request %r refused: %s %s", request_id, error.code, error.message)
        return reply.failure(request_id, error)

    async def _execute(self, plan: Plan) -> tuple[list[StepResult], EncodedImage | None]:
        results: list[StepResult] = []
        for step in plan.steps:
            try:
                results.append(await self._desktop.run(step.action, plan.after))
            except ActionError as exc:
                if exc.field is not None and exc.field.startswith("action.") and step.field != "action":
                    exc.field = step.field + exc.field[len("action") :]
                raise
        image = results[-1].image
        if image is None and plan.after.screenshot is not None:
            image = (await self._desktop.capture(plan.after.screenshot, plan.after)).image
        return results, image
