"""The screen, the pointer and the keyboard, a part of each twin (:class:`Screen`, :class:`AsyncScreen`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack, overload

from corral.client import Envelope
from corral.protocol.results import Done, Position, ScrolledClicks, ScrolledPixels, Typed
from corral.sdk.connection import AsyncConnected, Connected
from corral.sdk.messages import ShotOptions, ZoomOptions, messages


class Screen(Connected):
    """The screen, the pointer and the keyboard: each action answers its result model (where the
    pointer is, what was typed); ``screenshot``/``zoom`` answer the image's bytes."""

    def screenshot(self, format: str = "png", **options: Unpack[ShotOptions]) -> bytes:
        return self._send(messages.screenshot(format, options))

    def zoom(self, x: int, y: int, width: int, height: int, **options: Unpack[ZoomOptions]) -> bytes:
        return self._send(messages.zoom(x, y, width, height, options))

    def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Unpack[Envelope],
    ) -> Position:
        return self._send(messages.click(x, y, button, count, modifiers, envelope))

    def double_click(self, x: int | None = None, y: int | None = None, **envelope: Unpack[Envelope]) -> Position:
        return self._send(messages.click(x, y, "left", 2, (), envelope))

    def right_click(self, x: int | None = None, y: int | None = None, **envelope: Unpack[Envelope]) -> Position:
        return self._send(messages.click(x, y, "right", 1, (), envelope))

    def mouse_down(self, button: str = "left") -> Position:
        return self._send(messages.pointer("mouse_down", button=button))

    def mouse_up(self, button: str = "left") -> Position:
        return self._send(messages.pointer("mouse_up", button=button))

    def move(self, x: int, y: int) -> Position:
        return self._send(messages.pointer("move", x=x, y=y))

    def drag(self, path: Sequence[tuple[int, int]], **envelope: Unpack[Envelope]) -> Position:
        return self._send(messages.drag(path, envelope))

    @overload
    def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str,
        clicks: int | None = None,
        **envelope: Unpack[Envelope],
    ) -> ScrolledClicks: ...
    @overload
    def scroll(
        self, x: int | None = None, y: int | None = None, *, dx: int, dy: int, **envelope: Unpack[Envelope]
    ) -> ScrolledPixels: ...
    def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Unpack[Envelope],
    ) -> ScrolledClicks | ScrolledPixels:
        """By wheel clicks (``direction``, ``clicks``): :class:`ScrolledClicks`; by pixels (``dx``,
        ``dy``): :class:`ScrolledPixels`. Each form has its own type (the overloads say which)."""
        return self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    def type(self, text: str, **envelope: Unpack[Envelope]) -> Typed:
        return self._send(messages.type(text, envelope))

    def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Unpack[Envelope]) -> Done:
        return self._send(messages.key(keys, hold_ms, envelope))

    def wait(self, ms: int) -> Done:
        return self._send(messages.wait(ms))

    def cursor_position(self) -> tuple[int, int]:
        return self._send(messages.cursor_position())

    def clipboard_get(self) -> str:
        return self._send(messages.clipboard_get())

    def clipboard_set(self, text: str) -> None:
        self._send(messages.clipboard_set(text))


class AsyncScreen(AsyncConnected):
    """The async twin of :class:`Screen`."""

    async def screenshot(self, format: str = "png", **options: Unpack[ShotOptions]) -> bytes:
        return await self._send(messages.screenshot(format, options))

    async def zoom(self, x: int, y: int, width: int, height: int, **options: Unpack[ZoomOptions]) -> bytes:
        return await self._send(messages.zoom(x, y, width, height, options))

    async def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str = "left",
        count: int = 1,
        modifiers: Sequence[str] = (),
        **envelope: Unpack[Envelope],
    ) -> Position:
        return await self._send(messages.click(x, y, button, count, modifiers, envelope))

    async def double_click(self, x: int | None = None, y: int | None = None, **envelope: Unpack[Envelope]) -> Position:
        return await self._send(messages.click(x, y, "left", 2, (), envelope))

    async def right_click(self, x: int | None = None, y: int | None = None, **envelope: Unpack[Envelope]) -> Position:
        return await self._send(messages.click(x, y, "right", 1, (), envelope))

    async def mouse_down(self, button: str = "left") -> Position:
        return await self._send(messages.pointer("mouse_down", button=button))

    async def mouse_up(self, button: str = "left") -> Position:
        return await self._send(messages.pointer("mouse_up", button=button))

    async def move(self, x: int, y: int) -> Position:
        return await self._send(messages.pointer("move", x=x, y=y))

    async def drag(self, path: Sequence[tuple[int, int]], **envelope: Unpack[Envelope]) -> Position:
        return await self._send(messages.drag(path, envelope))

    @overload
    async def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str,
        clicks: int | None = None,
        **envelope: Unpack[Envelope],
    ) -> ScrolledClicks: ...
    @overload
    async def scroll(
        self, x: int | None = None, y: int | None = None, *, dx: int, dy: int, **envelope: Unpack[Envelope]
    ) -> ScrolledPixels: ...
    async def scroll(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        direction: str | None = None,
        clicks: int | None = None,
        dx: int | None = None,
        dy: int | None = None,
        **envelope: Unpack[Envelope],
    ) -> ScrolledClicks | ScrolledPixels:
        return await self._send(messages.scroll(x, y, direction, clicks, dx, dy, envelope))

    async def type(self, text: str, **envelope: Unpack[Envelope]) -> Typed:
        return await self._send(messages.type(text, envelope))

    async def key(self, keys: str, *, hold_ms: int | None = None, **envelope: Unpack[Envelope]) -> Done:
        return await self._send(messages.key(keys, hold_ms, envelope))

    async def wait(self, ms: int) -> Done:
        return await self._send(messages.wait(ms))

    async def cursor_position(self) -> tuple[int, int]:
        return await self._send(messages.cursor_position())

    async def clipboard_get(self) -> str:
        return await self._send(messages.clipboard_get())

    async def clipboard_set(self, text: str) -> None:
        await self._send(messages.clipboard_set(text))
