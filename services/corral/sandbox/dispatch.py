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
from corral.sandbox.recorder import Recorder

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        desktop: Desktop,
        limits: Limits,
        reporter: ActionReporter | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._desktop = desktop
        self._limits = limits
        self._reporter = reporter  # tells the egress proxy which action is in flight
        self._recorder = recorder  # keeps each request, its reply and a frame for the session recording
        self._seq = 0
        # Ids stay unique in the session's audit log across controller restarts.
        self._boot = secrets.token_hex(2)

    async def handle(self, raw: str | bytes) -> dict[str, Any]:
        """One message in, one reply out; never raises for anything the client sent."""
        if self._recorder is not None:
            await self._recorder.before_action()
        started, wall = time.perf_counter(), time.time()
        note: dict[str, Any] = {}
        out = await self._handle(raw, started, note)
        if self._recorder is not None:
            self._recorder.record(
                {
                    "action_id": note.get("action_id"),
                    "started": wall,
                    "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
                    "dialect": note.get("dialect"),
                    "request": note.get("request", _text(raw)),
                    "native": note.get("native"),
                    "ok": out.get("ok"),
                    "url": note.get("url"),
                    "title": note.get("title"),
                    "error": out.get("error"),
                    "reply": out,
                }
            )
        return out

    async def _handle(self, raw: str | bytes, started: float, note: dict[str, Any]) -> dict[str, Any]:
        request_id: RequestId = None
        try:
            obj = decode(raw, self._limits)
            note["request"] = obj
            request_id = request_id_of(obj)
            plan = plan_request(obj, self._desktop.size, self._limits)
            self._seq += 1
            action_id = f"a{self._seq}.{self._boot}"
            note.update(
                action_id=action_id,
                dialect=plan.dialect.value,
                native=[step.action.model_dump(mode="json", exclude_none=True) for step in plan.steps],
            )
            try:
                async with asyncio.timeout(plan.timeout_ms / 1000):
                    async with self._desktop.lock:
                        if self._reporter is not None:
                            await self._reporter.started(action_id)
                        try:
                            results, image = await self._execute(plan)
                            note["url"] = self._desktop.browser.current_url()
                            last = results[-1].data if results else None
                            if isinstance(last, dict) and isinstance(last.get("title"), str):
                                note["title"] = last["title"]  # a navigate or page_info said it exactly
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


def _text(raw: str | bytes, limit: int = 4096) -> str:
    """A message that could not be read, as text for the recording (cut short)."""
    text = raw if isinstance(raw, str) else raw.decode(errors="replace")
    return text[:limit]
