"""Keyboard and pointer input through XTest over one persistent X connection.

This replaces one ``xdotool`` subprocess per action (about 100 ms each, plus
xdotool's own sleep after a click) with XTest requests that cost well under a
millisecond. Keys follow xdotool's semantics: a keysym missing from the keymap
is bound to a spare keycode for as long as it is needed, which is how any
Unicode text is typed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from Xlib import XK, X
from Xlib.display import Display
from Xlib.ext import xtest

from corral.protocol.keys import Key, KeyCombo, keysym_for_char

BUTTONS: dict[str, int] = {"left": 1, "middle": 2, "right": 3, "back": 8, "forward": 9}
SCROLL_BUTTONS: dict[str, int] = {"up": 4, "down": 5, "left": 6, "right": 7}

# How long a click waits for the server to have processed it (see XInput._processed); a window manager
# replays a grabbed click within a millisecond or two.
_PROCESSED_WAIT_S = 0.2

# A spare keycode just rebound may still be read by a client with the old binding;
# only reuse one that has been idle at least this long.
_REBIND_GUARD_S = 0.05


@dataclass(frozen=True, slots=True)
class _Stroke:
    keycode: int
    shift: bool


class XInput:
    """XTest input on one display. Not thread-safe: call from one thread (the event loop)."""

    def __init__(self, display_name: str) -> None:
        self._display = Display(display_name)
        if not self._display.query_extension("XTEST"):
            raise RuntimeError(f"X server {display_name} has no XTEST extension")
        screen = self._display.screen()
        self._root = screen.root
        self.width = int(screen.width_in_pixels)
        self.height = int(screen.height_in_pixels)
        self._min_keycode = int(self._display.display.info.min_keycode)
        self._max_keycode = int(self._display.display.info.max_keycode)
        self._strokes: dict[int, _Stroke] = {}
        self._spare: OrderedDict[int, float] = OrderedDict()  # keycode -> last use, least recent first
        self._bound: dict[int, int] = {}  # keysym -> spare keycode bound to it
        self._load_keymap()

    def _load_keymap(self) -> None:
        count = self._max_keycode - self._min_keycode + 1
        mapping = self._display.get_keyboard_mapping(self._min_keycode, count)
        strokes: dict[int, _Stroke] = {}
        spare: list[int] = []
        for offset, syms in enumerate(mapping):
            keycode = self._min_keycode + offset
            if not any(syms):
                if keycode > self._min_keycode:  # keycode 8 confuses some clients
                    spare.append(keycode)
                continue
            # Levels 0 and 1 are plain and shifted; others need AltGr and are left to rebinding.
            for level, sym in enumerate(syms[:2]):
                if sym and sym not in strokes:
                    strokes[sym] = _Stroke(keycode, shift=level == 1)
        self._strokes = strokes
        self._spare = OrderedDict((k, 0.0) for k in spare)
        self._shift = self._stroke_for(XK.XK_Shift_L).keycode

    def close(self) -> None:
        self._display.close()

    # -- pointer ---------------------------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        reply = self._root.query_pointer()
        return int(reply.root_x), int(reply.root_y)

    def move(self, x: int, y: int) -> None:
        xtest.fake_input(self._display, X.MotionNotify, x=x, y=y)
        self._display.sync()

    def button(self, button: str, down: bool) -> None:
        code = BUTTONS[button]
        xtest.fake_input(self._display, X.ButtonPress if down else X.ButtonRelease, code)
        self._display.sync()
        self._processed(code, down)

    def click(self, button: str) -> None:
        code = BUTTONS[button]
        xtest.fake_input(self._display, X.ButtonPress, code)
        self._display.sync()
        self._processed(code, True)
        xtest.fake_input(self._display, X.ButtonRelease, code)
        self._display.sync()
        self._processed(code, False)

    def _processed(self, code: int, down: bool) -> None:
        """Wait (briefly, polling) until the server has processed button ``code`` going ``down`` or up.

        openbox grabs a press synchronously, to focus the window it lands on, then replays it: until then
        the pointer's events wait in the server while the keyboard's do not, so a key sent right after a
        click reached the page before the click and its focus did (the first letter typed was lost). The
        pointer's logical state (QueryPointer's mask) lags while its events wait: once the release shows,
        the press has gone to the window. Buttons past 5 have no mask bit and are not waited for.
        """
        if code > 5:
            return
        mask = X.Button1Mask << (code - 1)
        deadline = time.monotonic() + _PROCESSED_WAIT_S
        while bool(self._root.query_pointer().mask & mask) != down and time.monotonic() < deadline:
            time.sleep(0.0002)

    def scroll(self, direction: str, clicks: int) -> None:
        code = SCROLL_BUTTONS[direction]
        for _ in range(clicks):
            xtest.fake_input(self._display, X.ButtonPress, code)
            xtest.fake_input(self._display, X.ButtonRelease, code)
        self._display.sync()

    # -- keyboard --------------------------------------------------------------------------------------

    def _stroke_for(self, keysym: int) -> _Stroke:
        stroke = self._strokes.get(keysym)
        if stroke is not None:
            return stroke
        keycode = self._bound.get(keysym)
        if keycode is None:
            keycode = self._bind(keysym)
        self._spare.move_to_end(keycode)
        self._spare[keycode] = time.monotonic()
        return _Stroke(keycode, shift=False)

    def _bind(self, keysym: int) -> int:
        if not self._spare:
            raise RuntimeError("the keymap has no spare keycode to bind a key to")
        keycode, last_used = next(iter(self._spare.items()))
        idle = time.monotonic() - last_used
        if idle < _REBIND_GUARD_S:
            time.sleep(_REBIND_GUARD_S - idle)
        for sym, code in list(self._bound.items()):
            if code == keycode:
                del self._bound[sym]
        # Same keysym on both levels, so a held shift does not change it.
        self._display.change_keyboard_mapping(keycode, [(keysym, keysym)])
        self._display.sync()
        self._bound[keysym] = keycode
        return keycode

    def key_down(self, keys: tuple[Key, ...]) -> None:
        for key in keys:
            xtest.fake_input(self._display, X.KeyPress, self._stroke_for(key.keysym).keycode)
        self._display.sync()

    def key_up(self, keys: tuple[Key, ...]) -> None:
        for key in reversed(keys):
            xtest.fake_input(self._display, X.KeyRelease, self._stroke_for(key.keysym).keycode)
        self._display.sync()

    def press_combo(self, combo: KeyCombo) -> None:
        """Press every key of ``combo`` in order, release in reverse (``ctrl+shift+t``)."""
        strokes = [self._stroke_for(key.keysym) for key in combo.keys]
        held_shift = any(key.name in ("Shift_L", "Shift_R") for key in combo.keys)
        # A lone shifted symbol (ctrl+T, or '?') needs shift, as xdotool adds it.
        add_shift = not held_shift and strokes[-1].shift
        codes = [s.keycode for s in strokes[:-1]] + ([self._shift] if add_shift else []) + [strokes[-1].keycode]
        for code in codes:
            xtest.fake_input(self._display, X.KeyPress, code)
        for code in reversed(codes):
            xtest.fake_input(self._display, X.KeyRelease, code)
        self._display.sync()

    def bind_for(self, text: str) -> bool:
        """Bind every character of ``text`` missing from the keymap; True when the keymap changed.

        Clients reload a changed keymap asynchronously, so the caller lets them catch up before typing.
        """
        wanted = {keysym_for_char(c) for c in text} - self._strokes.keys()
        if len(wanted) > len(self._spare):
            raise ValueError(f"{len(wanted)} distinct unmapped characters; at most {len(self._spare)} at once")
        # Refresh the ones already bound first, so binding the rest never evicts one this text needs.
        missing = [keysym for keysym in wanted if keysym not in self._bound]
        for keysym in wanted - set(missing):
            self._stroke_for(keysym)
        for keysym in missing:
            self._stroke_for(keysym)
        return bool(missing)

    def on_keymap(self, char: str) -> bool:
        """Whether ``char`` is typed with a keycode of the base keymap (no binding needed)."""
        return keysym_for_char(char) in self._strokes

    def focused_wm_class(self) -> str:
        """WM_CLASS (lower case, instance and class) of the window that has the keyboard focus, or ''."""
        window = self._display.get_input_focus().focus
        for _ in range(16):
            if not hasattr(window, "get_wm_class") or window == self._root:
                return ""
            wm_class = window.get_wm_class()
            if wm_class:
                return " ".join(wm_class).lower()
            window = window.query_tree().parent
        return ""

    def spare_keycodes(self) -> int:
        return len(self._spare)

    def type_text(self, text: str) -> None:
        """Type ``text`` as key strokes; characters not on the keymap are bound to spare keycodes."""
        for char in text:
            stroke = self._stroke_for(keysym_for_char(char))
            if stroke.shift:
                xtest.fake_input(self._display, X.KeyPress, self._shift)
            xtest.fake_input(self._display, X.KeyPress, stroke.keycode)
            xtest.fake_input(self._display, X.KeyRelease, stroke.keycode)
            if stroke.shift:
                xtest.fake_input(self._display, X.KeyRelease, self._shift)
        self._display.sync()
