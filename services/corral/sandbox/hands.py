"""The input actions: the pointer, the keyboard, the clipboard and ``wait``, carried out through X
(XTest) and, where X cannot do it exactly, Chromium's DevTools (pixel scrolling over the page, text
off the keymap). :class:`Hands` answers each with its :mod:`corral.protocol.results` model;
:class:`corral.sandbox.desktop.Desktop` runs it under its lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import assert_never

from corral.protocol import actions as a
from corral.protocol import results as r
from corral.protocol.keys import Key, parse_key
from corral.sandbox.display import clipboard
from corral.sandbox.display.xinput import XInput
from corral.sandbox.settings import ControllerSettings
from corral.sandbox.web.browser import Browser

log = logging.getLogger(__name__)

MULTI_CLICK_GAP_S = 0.02
# How long a press or release may take to reach its window (XInput.delivered). openbox replays a grabbed
# click within a millisecond or two, but on two loaded cores it waited past the old 0.2 s bound, and the
# keys sent then overtook the click (MCP's click-then-type kept its title "ready"). The first few ms are
# polled at once (a click stays about a millisecond); after that the wait lets the event loop run.
DELIVERY_FAST_S = 0.005
DELIVERY_WAIT_S = 5.0
DELIVERY_POLL_S = 0.002
WHEEL_CLICK_PX = 53  # a wheel click scrolls about this far in Chromium and most toolkits
# CDP's modifier bits (Input.dispatchMouseEvent) for the modifier keysyms.
_CDP_MODIFIERS = {
    "Alt_L": 1,
    "Alt_R": 1,
    "Control_L": 2,
    "Control_R": 2,
    "Meta_L": 4,
    "Super_L": 4,
    "Shift_L": 8,
    "Shift_R": 8,
}

# Viewport origin of Chromium's active tab on the screen, for pixel-exact wheel events over CDP.
_VIEWPORT_JS = """() => {
  const border = Math.max(0, (window.outerWidth - window.innerWidth) / 2);
  return [window.screenX + border, window.screenY + window.outerHeight - window.innerHeight - border,
          window.innerWidth, window.innerHeight];
}"""

HandAction = (
    a.Click
    | a.MouseDown
    | a.MouseUp
    | a.Move
    | a.Drag
    | a.Scroll
    | a.Type
    | a.Key
    | a.Wait
    | a.CursorPosition
    | a.ClipboardGet
    | a.ClipboardSet
)
HandResult = r.Position | r.Scrolled | r.Typed | r.ClipboardText | r.Done


class Hands:
    """The pointer and the keyboard (``input``), with Chromium (``browser``) where X falls short."""

    def __init__(self, settings: ControllerSettings, input: XInput, browser: Browser) -> None:
        self._settings = settings
        self.input = input
        self._browser = browser

    async def run(self, action: HandAction) -> HandResult:
        """Carry out one input action; its coordinates are already checked and scaled."""
        match action:
            case a.Click():
                self._move_if(action.x, action.y)
                with self._held(action.modifiers):
                    for index in range(action.count):
                        if index:
                            # X timestamps are in ms and Chromium drops a repeat click with the same stamp.
                            await asyncio.sleep(MULTI_CLICK_GAP_S)
                        await self._button(action.button, down=True)
                        await self._button(action.button, down=False)
                return self.position()
            case a.MouseDown() | a.MouseUp():
                self._move_if(action.x, action.y)
                await self._button(action.button, down=isinstance(action, a.MouseDown), bare=True)
                return self.position()
            case a.Move():
                with self._held(action.modifiers):
                    self.input.move(action.x, action.y)
                return self.position()
            case a.Drag():
                await self._drag(action)
                return self.position()
            case a.Scroll():
                return r.Scrolled(await self._scroll(action))
            case a.Type():
                return r.Typed(typed=len(action.text), via=await self._type(action))
            case a.Key():
                await self._key(action)
                return r.Done()
            case a.Wait():
                await asyncio.sleep(action.ms / 1000)
                return r.Done()
            case a.CursorPosition():
                return self.position()
            case a.ClipboardGet():
                return r.ClipboardText(text=await clipboard.get_text(self._settings.display))
            case a.ClipboardSet():
                await clipboard.set_text(self._settings.display, action.text)
                return r.Done()
            case _:
                assert_never(action)

    def position(self) -> r.Position:
        x, y = self.input.position()
        return r.Position(x=x, y=y)

    @contextlib.contextmanager
    def _held(self, modifiers: list[str]) -> Iterator[None]:
        keys: tuple[Key, ...] = tuple(parse_key(name) for name in modifiers)
        if keys:
            self.input.key_down(keys)
        try:
            yield
        finally:
            if keys:
                self.input.key_up(keys)

    async def _button(self, button: str, *, down: bool, bare: bool = False) -> None:
        """Press or release ``button``, then wait until its window has it (XInput.delivered): input sent
        after this action then comes after it."""
        self.input.button(button, down, bare=bare)
        deadline = time.monotonic() + DELIVERY_WAIT_S
        if self.input.delivered(button, down, bare=bare, within_s=DELIVERY_FAST_S):
            return
        while not self.input.delivered(button, down, bare=bare):
            if time.monotonic() >= deadline:
                what = "press" if down else "release"
                log.warning("a %s of %s did not reach its window within %.0f s", what, button, DELIVERY_WAIT_S)
                return
            await asyncio.sleep(DELIVERY_POLL_S)

    def _move_if(self, x: int | None, y: int | None) -> None:
        if x is not None and y is not None:
            self.input.move(x, y)

    async def _drag(self, action: a.Drag) -> None:
        first = action.path[0]
        with self._held(action.modifiers):
            self.input.move(first.x, first.y)
            await self._button(action.button, down=True, bare=True)
            try:
                x, y = first.x, first.y
                for point in action.path[1:]:
                    # Intermediate motion, so pages that track pointermove see a path and not a jump.
                    steps = max(1, math.ceil(math.dist((x, y), (point.x, point.y)) / action.step_px))
                    for i in range(1, steps + 1):
                        self.input.move(round(x + (point.x - x) * i / steps), round(y + (point.y - y) * i / steps))
                        # Paced like a hand, so pages that coalesce pointer events per frame still see a path.
                        await asyncio.sleep(action.step_ms / 1000)
                    x, y = point.x, point.y
            finally:
                await self._button(action.button, down=False)

    async def _scroll(self, action: a.Scroll) -> r.ScrolledClicks | r.ScrolledPixels:
        self._move_if(action.x, action.y)
        if action.direction is not None:
            with self._held(action.modifiers):
                self.input.scroll(action.direction, action.clicks or 1)
            return r.ScrolledClicks(clicks=action.clicks or 1, direction=action.direction)
        return await self._scroll_pixels(action.dx or 0, action.dy or 0, action.modifiers)

    async def _scroll_pixels(self, dx: int, dy: int, modifiers: list[str]) -> r.ScrolledPixels:
        """Pixel-exact wheel events over CDP where the pointer is over the page, wheel clicks elsewhere."""
        px, py = self.input.position()
        page = await self._browser.page()
        ox, oy, vw, vh = await page.evaluate(_VIEWPORT_JS)
        vx, vy = px - ox, py - oy
        if 0 <= vx < vw and 0 <= vy < vh:
            session = await page.context.new_cdp_session(page)
            try:
                mask = 0
                for name in modifiers:
                    mask |= _CDP_MODIFIERS.get(parse_key(name).name, 0)
                await session.send(
                    "Input.dispatchMouseEvent",
                    {"type": "mouseWheel", "x": vx, "y": vy, "deltaX": dx, "deltaY": dy, "modifiers": mask},
                )
            finally:
                await session.detach()
            return r.ScrolledPixels(dx=dx, dy=dy, via="cdp")
        # Off the page: X wheel clicks.
        with self._held(modifiers):
            if dy:
                self.input.scroll("down" if dy > 0 else "up", max(1, round(abs(dy) / WHEEL_CLICK_PX)))
            if dx:
                self.input.scroll("right" if dx > 0 else "left", max(1, round(abs(dx) / WHEEL_CLICK_PX)))
        return r.ScrolledPixels(dx=dx, dy=dy, via="wheel")

    def _chunks(self, text: str) -> Iterator[str]:
        """Pieces of at most type_chunk_chars whose unmapped characters fit the spare keycodes."""
        limit = max(1, self.input.spare_keycodes())
        size = self._settings.type_chunk_chars
        chunk: list[str] = []
        distinct: set[str] = set()
        for char in text:
            if len(chunk) >= size or (char not in distinct and len(distinct) >= limit):
                yield "".join(chunk)
                chunk, distinct = [], set()
            chunk.append(char)
            if not self.input.on_keymap(char):
                distinct.add(char)
        if chunk:
            yield "".join(chunk)

    async def _type(self, action: a.Type) -> r.TypedVia:
        """Type through X; text off the keymap goes through CDP while Chromium has the focus.

        Chromium reloads a changed X keymap late and meanwhile misreads or drops keys, so
        rebinding spare keycodes (xdotool's way) is kept for other windows.
        """
        if not all(self.input.on_keymap(char) for char in action.text) and (
            "chromium" in self.input.focused_wm_class()
        ):
            await self._browser.type_text(action.text, action.delay_ms)
            return "cdp"
        for chunk in self._chunks(action.text):
            if self.input.bind_for(chunk):
                # Clients (Chromium) reload the keymap asynchronously after a change.
                await asyncio.sleep(self._settings.keymap_settle_ms / 1000)
            if action.delay_ms:
                for char in chunk:
                    self.input.type_text(char)
                    await asyncio.sleep(action.delay_ms / 1000)
            else:
                self.input.type_text(chunk)
                await asyncio.sleep(0)  # let a timeout or a disconnect cut in between chunks
        return "x"

    async def _key(self, action: a.Key) -> None:
        combos = action.combos()
        for _ in range(action.repeat):
            for combo in combos:
                if action.hold_ms:
                    self.input.key_down(combo.keys)
                    try:
                        await asyncio.sleep(action.hold_ms / 1000)
                    finally:
                        self.input.key_up(combo.keys)
                else:
                    self.input.press_combo(combo)
                await asyncio.sleep(0)  # a long sequence must not hold the event loop (or the timeout)
