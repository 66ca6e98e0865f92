"""What every part of a twin stands on: the session's WebSocket, and how one message goes and its
reply comes back (blocking or awaited), with the control lease's hand-back heard on the way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

from corral.client import AsyncSandboxClient, Frame, Request, SandboxClient, is_reply
from corral.gateway_client import AsyncGateway, Gateway
from corral.gateway_models import SessionInfo
from corral.protocol.results import HandBack
from corral.sdk.messages import Message, model_of

T = TypeVar("T")


def waiting(body: Request, wait_ms: int) -> Request:
    """A message with the sandbox's wait for the control lease (``wait_for_control_ms``), unless it
    says its own."""
    return body if wait_ms <= 0 or "wait_for_control_ms" in body else {**body, "wait_for_control_ms": wait_ms}


def hand_back(reply: Frame) -> HandBack | None:
    """The reply's ``control`` member: a human handed the control lease back, else None."""
    handed = reply.get("control")
    return model_of(handed, HandBack) if isinstance(handed, dict) else None


class Connected:
    """A session's blocking connection: :meth:`_send` sends one message and reads its reply."""

    info: SessionInfo
    id: str
    _ws: SandboxClient
    _gateway: Gateway
    _wait_for_control_ms = 0
    _handed_back: HandBack | None = None

    def _send(self, message: Message[T]) -> T:
        reply = self._ws.request(waiting(message.body, self._wait_for_control_ms))
        self._heard(reply)
        return message.read(reply)

    def _heard(self, reply: Frame) -> None:
        self._handed_back = hand_back(reply)

    def _hearing(self, frames: Iterator[Frame]) -> Iterator[Frame]:
        for frame in frames:
            if is_reply(frame):
                self._heard(frame)
            yield frame


class AsyncConnected:
    """The async twin of :class:`Connected`."""

    info: SessionInfo
    id: str
    _ws: AsyncSandboxClient
    _gateway: AsyncGateway
    _wait_for_control_ms = 0
    _handed_back: HandBack | None = None

    async def _send(self, message: Message[T]) -> T:
        reply = await self._ws.request(waiting(message.body, self._wait_for_control_ms))
        self._heard(reply)
        return message.read(reply)

    def _heard(self, reply: Frame) -> None:
        self._handed_back = hand_back(reply)

    async def _hearing(self, frames: AsyncIterator[Frame]) -> AsyncIterator[Frame]:
        async for frame in frames:
            if is_reply(frame):
                self._heard(frame)
            yield frame
