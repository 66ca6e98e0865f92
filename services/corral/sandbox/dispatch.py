"""The one place where a request becomes a reply: every ActionError turns into a failure reply here."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from corral.contracts.actors import AGENT
from corral.contracts.limits import MAX_FRAME_BYTES
from corral.errors import ActionError, ErrorCode
from corral.protocol import reply, vendor
from corral.protocol import results as r
from corral.protocol.actions import ScreenshotOptions
from corral.protocol.envelope import Limits, decode, plan_request, request_id_of
from corral.protocol.plan import ActionResult, After, EncodedImage, Plan, RequestId
from corral.protocol.reply import Reply
from corral.sandbox.agent.processes import Emit, RunContext
from corral.sandbox.desktop import Desktop
from corral.sandbox.egress import ActionReporter
from corral.sandbox.recorder import ActionEvent, Recorder

log = logging.getLogger(__name__)

# How long a failed computer_call waits for the screenshot its output needs (else it has none).
FAILURE_SCREENSHOT_S = 5.0


@dataclass(frozen=True, slots=True)
class Planned:
    """A request that was read and planned: the id the audit log knows it by and its native steps."""

    action_id: str
    dialect: str
    native: Sequence[Mapping[str, object]]  # the steps as JSON, as the recording keeps them


@dataclass(frozen=True, slots=True)
class Ran:
    """What running a plan gave: each step's result, the reply's image, and the page it ended on."""

    results: list[ActionResult]
    image: EncodedImage | None
    url: str | None
    title: str | None  # when a navigate or page_info said it exactly


@dataclass(frozen=True, slots=True)
class Handled:
    """One request's reply and what the recording keeps of how it came about."""

    reply: Reply
    request: object  # as read, or its text when it could not be read
    planned: Planned | None = None
    ran: Ran | None = None

    def event(self, started: float, elapsed_ms: float, number: int | None = None) -> ActionEvent:
        """The recorder's event for this request (``number``: its place in the order requests came in)."""
        return ActionEvent(
            action_id=self.planned.action_id if self.planned else None,
            request_seq=number,
            started=started,
            elapsed_ms=round(elapsed_ms, 3),
            dialect=self.planned.dialect if self.planned else None,
            request=self.request,
            native=self.planned.native if self.planned else None,
            ok=self.reply["ok"],
            url=self.ran.url if self.ran else None,
            title=self.ran.title if self.ran else None,
            error=self.reply.get("error"),
            reply=self.reply,
        )


@dataclass(frozen=True, slots=True)
class Incoming:
    """A message as read: the request (or its text), its id, its plan or why it has none, and when
    it came in. Reading is cheap and never raises; running it is :meth:`Dispatcher.run`."""

    request: object  # as read, or its text when it could not be read
    request_id: RequestId
    plan: Plan | None
    error: Exception | None
    started: float
    wall: float
    number: int | None = None  # the recorder's count of requests as they came in (None: not recording)
    # The transport waited for the lease already (Dispatcher.wait_for_control, where a closed
    # connection could cancel it): running it does not wait again.
    control_waited: bool = False

    @property
    def apart(self) -> bool:
        """Runs beside other requests, outside the desktop's lock: every step's action is flagged
        ``runs_apart`` (a command, process, file, tool, ``secrets`` or lease action)."""
        return self.plan is not None and all(step.action.runs_apart for step in self.plan.steps)


class Dispatcher:
    def __init__(
        self,
        desktop: Desktop,
        limits: Limits,
        reporter: ActionReporter | None = None,
        recorder: Recorder | None = None,
        turn_over: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._desktop = desktop
        # What the agent's requests wait for once the lease is theirs: the end of a person's turn done
        # (corral.sandbox.agent.freezer.AgentFreezer.thawed_for_agent: the selections emptied, the agent's
        # processes continued), or the emptying would land on what the agent's first requests do.
        self._turn_over = turn_over
        self._limits = limits
        self._reporter = reporter  # tells the egress proxy which action is in flight
        self._recorder = recorder  # keeps each request, its reply and a frame for the session recording
        self._seq = 0
        # Ids stay unique in the session's audit log across controller restarts.
        self._boot = secrets.token_hex(2)

    @property
    def desktop(self) -> Desktop:
        """The desktop the requests run on."""
        return self._desktop

    async def handle(self, raw: str | bytes, emit: Emit | None = None) -> Reply:
        """One message in, one reply out (fitted to a frame); never raises for anything the client sent."""
        incoming = self.read(raw)
        out, _ = fitted(incoming, await self.run(incoming, emit))
        return out

    def read(self, raw: str | bytes) -> Incoming:
        """Decode and plan one message (the caller decides from :attr:`Incoming.apart` how to run it)."""
        started, wall = time.perf_counter(), time.time()
        number = self._recorder.arrived() if self._recorder is not None else None
        request: object = _text(raw)
        request_id: RequestId = None
        try:
            request = decoded = decode(raw, self._limits)
            request_id = request_id_of(decoded)
            plan = plan_request(decoded, self._desktop.size, self._limits)
        except Exception as exc:
            return Incoming(request, request_id, None, exc, started, wall, number)
        return Incoming(request, request_id, plan, None, started, wall, number)

    def must_wait_for_control(self, incoming: Incoming) -> bool:
        """Whether running ``incoming`` would wait for the lease now (another holds it and the request
        asked to wait)."""
        plan = incoming.plan
        return (
            plan is not None
            and plan.wait_for_control_ms > 0
            and not _asks_for_control(plan)
            and not self._desktop.lease.held_by(AGENT)
        )

    async def wait_for_control(self, incoming: Incoming) -> Incoming:
        """The request's wait for the lease (up to its ``wait_for_control_ms``) before it runs, for a
        transport to cancel when its client goes away; :meth:`run` then refuses at once if the lease
        did not come back. The returned :class:`Incoming` is the one to run."""
        if not self.must_wait_for_control(incoming):
            return incoming
        assert incoming.plan is not None
        await self._desktop.lease.wait_for_return(incoming.plan.wait_for_control_ms)
        return replace(incoming, control_waited=True)

    async def run(
        self, incoming: Incoming, emit: Emit | None = None, listening: Callable[[], bool] = lambda: True
    ) -> Reply:
        """Run a read message; ``emit`` sends its events (an exec's streamed output), if the
        transport can. ``listening`` says whether the reply still has a reader: a hand-back is not
        spent on a reply nobody reads."""
        if self._recorder is not None:
            await self._recorder.before_action()
        handled = await self._handle(incoming, emit, listening)
        if self._recorder is not None:
            elapsed_ms = (time.perf_counter() - incoming.started) * 1000
            self._recorder.record(handled.event(incoming.wall, elapsed_ms, incoming.number))
        return handled.reply

    async def _handle(self, incoming: Incoming, emit: Emit | None, listening: Callable[[], bool]) -> Handled:
        handled = await self._answer(incoming, emit)
        if not _asks_for_control(incoming.plan) and listening():
            handed = self._desktop.lease.take_hand_back()
            if handed is not None:  # a human handed the lease back: the agent hears of it once
                handled.reply["control"] = handed.result().wire()
        return handled

    async def _answer(self, incoming: Incoming, emit: Emit | None) -> Handled:
        request, plan = incoming.request, incoming.plan
        if plan is None:
            assert incoming.error is not None
            return Handled(await self._failed(incoming, incoming.error, None), request)
        planned: Planned | None = None
        ran: Ran | None = None
        try:
            planned = self._planned(plan)
            if not _asks_for_control(plan):
                # Before the desktop's lock and before any apart action: a command drives X as well.
                # Checked again once the lock is held (_run, _run_apart): a human may take it meanwhile.
                await self._desktop.lease.agent_may_act(0 if incoming.control_waited else plan.wait_for_control_ms)
                if self._turn_over is not None:
                    await self._turn_over()
            if incoming.apart:
                ran = await self._run_apart(plan, RunContext(planned.action_id, _with_id(emit, plan.request_id)))
            else:
                ran = await self._run(plan, planned.action_id)
            elapsed_ms = (time.perf_counter() - incoming.started) * 1000
            out = reply.success(plan, ran.results, ran.image, elapsed_ms)
        except Exception as exc:
            return Handled(await self._failed(incoming, exc, plan), request, planned, ran)
        out["action_id"] = planned.action_id  # what the egress audit log calls this action
        return Handled(out, request, planned, ran)

    async def _run_apart(self, plan: Plan, context: RunContext) -> Ran:
        """A process, file or ``secrets`` action: no desktop lock and no request timeout (a command has
        its own ``timeout_ms``; a file action is bounded by its size, ``secrets`` reads memory); the
        proxy learns a command's action from the proxy username its environment carries, and the others
        make no request. A vendor call may stop early (a shell_call's commands share one budget)."""
        results: list[ActionResult] = []
        began = time.perf_counter()
        for step in plan.steps:
            spent_ms = (time.perf_counter() - began) * 1000
            action = vendor.next_action(plan.call, step.action, results, spent_ms)
            if action is None:
                break
            try:
                results.append(await self._desktop.run(action, plan.after, context))
            except ActionError as exc:  # named as the request named it (as _execute does for desktop steps)
                exc.field = vendor.request_field(plan.call, step.field, exc.field)
                if not vendor.answers_each_step(plan.call):
                    raise
                results.append(ActionResult(r.StepFailed(error=r.ErrorBody.model_validate(exc.to_dict()))))
        image = None
        if plan.after.screenshot is not None:
            async with self._desktop.lock:
                if not _asks_for_control(plan):
                    self._desktop.lease.check(AGENT)  # a human took the lease while the command ran
                image = (await self._desktop.capture(plan.after.screenshot, plan.after)).image
        return Ran(results, image, None, None)

    def _planned(self, plan: Plan) -> Planned:
        self._seq += 1
        return Planned(
            action_id=f"a{self._seq}.{self._boot}",
            dialect=plan.dialect.value,
            # Only a recording keeps the steps as JSON: without one, no request pays for the dump.
            native=[step.action.model_dump(mode="json", exclude_none=True) for step in plan.steps]
            if self._recorder is not None
            else [],
        )

    async def _run(self, plan: Plan, action_id: str) -> Ran:
        """The plan's steps under the desktop's lock and the request's timeout, the proxy told of both ends."""
        try:
            async with asyncio.timeout(plan.timeout_ms / 1000):
                async with self._desktop.lock:
                    # Taken by a human while this waited for the lock: the human's turn, not the agent's.
                    self._desktop.lease.check(AGENT)
                    if self._reporter is not None:
                        await self._reporter.started(action_id)
                    # A download that begins now is this action's (corral.sandbox.web.downloadbook).
                    acts = self._desktop.browser.downloads.acts
                    acts.native_started(action_id, "+".join(dict.fromkeys(step.action.type for step in plan.steps)))
                    try:
                        results, image = await self._execute(plan)
                        url = self._desktop.browser.current_url()
                    finally:
                        acts.native_ended(action_id)
                        if self._reporter is not None:
                            await self._reporter.ended(action_id)
        except TimeoutError:
            raise ActionError(
                ErrorCode.TIMEOUT, f"the request did not finish within {plan.timeout_ms} ms", field="timeout_ms"
            ) from None
        last = results[-1].result if results else None
        title = last.title if isinstance(last, r.PageShown | r.TabShown) else None
        return Ran(results, image, url, title)

    async def _failed(self, incoming: Incoming, exc: Exception, plan: Plan | None) -> Reply:
        """The failure reply; a vendor call's (read even when planning failed) carries the vendor's own
        error form, a computer_call's being a current screenshot."""
        call = plan.call if plan is not None else vendor.call_of(incoming.request)
        image = await self._current_screen(plan) if call is not None and call.tool == "computer_call" else None
        return _failure(incoming.request_id, exc, call, image)

    async def _current_screen(self, plan: Plan | None) -> EncodedImage | None:
        """The screen now (at the plan's display size, if it had one), or None if it cannot be taken."""
        options = plan.after.screenshot if plan is not None and plan.after.screenshot else ScreenshotOptions()
        try:
            async with asyncio.timeout(FAILURE_SCREENSHOT_S):
                async with self._desktop.lock:
                    return (await self._desktop.capture(options, After())).image
        except Exception:
            log.warning("no screenshot for a failed computer_call", exc_info=True)
            return None

    def refuse(self, error: ActionError, request_id: RequestId = None) -> Reply:
        """The failure reply for a message refused before it could be read."""
        log.info("request %r refused: %s %s", request_id, error.code, error.message)
        return reply.failure(request_id, error)

    async def _execute(self, plan: Plan) -> tuple[list[ActionResult], EncodedImage | None]:
        results: list[ActionResult] = []
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


def fitted(incoming: Incoming, out: Reply) -> tuple[Reply, str]:
    """``out`` and its frame, or, when that frame is over :data:`MAX_FRAME_BYTES` (the gateway
    would close the connection with 1009, dropping every request on it), a ``too_large`` failure
    in its place (with the vendor's error form for a vendor call). Each action bounds its own
    output to fit; this is the backstop for one that did not."""
    frame = reply.encode(out)  # ASCII (json.dumps escapes the rest): its length is its size
    if len(frame) <= MAX_FRAME_BYTES:
        return out, frame
    call = incoming.plan.call if incoming.plan is not None else vendor.call_of(incoming.request)
    error = ActionError(
        ErrorCode.TOO_LARGE,
        f"the reply is {len(frame)} bytes, over the {MAX_FRAME_BYTES} bytes a frame takes; "
        "ask for less of it (a view_range, a smaller max_characters or max_output_chars, a window)",
    )
    refused = _failure(incoming.request_id, error, call)
    if "control" in out:  # the hand-back was taken for this reply: it must not be lost with it
        refused["control"] = out["control"]
    return refused, reply.encode(refused)


def _asks_for_control(plan: Plan | None) -> bool:
    """A ``control`` or ``request_control`` request: never refused by the lease, and it answers a
    hand-back in its result rather than as the reply's ``control``."""
    return plan is not None and bool(plan.steps) and all(step.action.lease for step in plan.steps)


def _failure(
    request_id: RequestId, exc: Exception, call: vendor.VendorCall | None = None, image: EncodedImage | None = None
) -> Reply:
    if isinstance(exc, ActionError):
        # The client's mistake or a refused action: worth a line, not a traceback.
        log.info("request %r failed: %s %s (%s)", request_id, exc.code, exc.message, exc.field)
        return reply.failure(request_id, exc, call, image)
    log.error("internal error handling request %r", request_id, exc_info=exc)
    error = ActionError(ErrorCode.INTERNAL, "internal error; see the controller log")
    return reply.failure(request_id, error, call, image)


def _with_id(emit: Emit | None, request_id: RequestId) -> Emit | None:
    """Events carry their request's id first (and never ``ok``: that is a reply's first key)."""
    if emit is None:
        return None
    send = emit

    async def emit_for_request(event: r.OutputEvent | r.CodeResultEvent) -> None:
        await send(event.model_copy(update={"id": request_id}))

    return emit_for_request


def _text(raw: str | bytes, limit: int = 4096) -> str:
    """A message that could not be read, as text for the recording (cut short)."""
    text = raw if isinstance(raw, str) else raw.decode(errors="replace")
    return text[:limit]
