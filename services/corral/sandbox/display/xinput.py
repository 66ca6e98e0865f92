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
from Xlib.protocol.event import ClientMessage

from corral.protocol.keys import Key, KeyCombo, keysym_for_char

BUTTONS: dict[str, int] = {"left": 1, "middle": 2, "right": 3, "back": 8, "forward": 9}
SCROLL_BUTTONS: dict[str, int] = {"up": 4, "down": 5, "left": 6, "right": 7}


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
        # A window of our own, never mapped, that the window manager is asked about (_ask_window_manager).
        self._asker = self._root.create_window(-1, -1, 1, 1, 0, X.CopyFromParent, X.InputOutput, X.CopyFromParent)
        self._question = self._display.intern_atom("_NET_REQUEST_FRAME_EXTENTS")
        self._answer = self._display.intern_atom("_NET_FRAME_EXTENTS")

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

    def button(self, button: str, down: bool, *, bare: bool = False) -> None:
        """Press or release ``button``; whether the window it lands on has it yet is :meth:`delivered`.
        A ``bare`` press (no release follows at once: mouse_down, a drag) also asks the window manager a
        question, answered once it has dealt with the press (see :meth:`delivered`)."""
        xtest.fake_input(self._display, X.ButtonPress if down else X.ButtonRelease, BUTTONS[button])
        if down and bare:
            self._ask_window_manager()
        self._display.sync()

    def delivered(self, button: str, down: bool, *, bare: bool = False, within_s: float = 0.0) -> bool:
        """Whether the server has handed ``button``'s last press (``down``) or release on to the window,
        asked again for up to ``within_s`` (polling: a replay normally takes a millisecond or two).

        openbox grabs a press synchronously, to focus the window it lands on, then replays it: until then
        the pointer's events wait in the server while the keyboard's do not, so a key sent meanwhile
        reaches the page before the click and its focus do. The pointer's logical state (QueryPointer's
        mask) shows a press as soon as the grab took it, and a release only once it left the queue, so
        a release that shows means its press has gone to the window. A ``bare`` press has no release to
        show it: the question :meth:`button` asked after it reaches openbox after the press, and openbox
        answers it only once it has dealt with the press (replayed it). Buttons past 5 have no mask bit
        and are not waited for.
        """
        code = BUTTONS[button]
        deadline = time.monotonic() + within_s
        while not self._delivered(code, down, bare):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
        return True

    def _delivered(self, code: int, down: bool, bare: bool) -> bool:
        if code > 5:
            return True
        if bool(self._root.query_pointer().mask & (X.Button1Mask << (code - 1))) != down:
            return False
        return not (down and bare) or self._asker.get_property(self._answer, X.AnyPropertyType, 0, 4) is not None

    def _ask_window_manager(self) -> None:
        """_NET_REQUEST_FRAME_EXTENTS for our own window: the window manager answers by setting the
        window's _NET_FRAME_EXTENTS (the old answer is deleted first), after the events before it.
        Asked only after a press and waited for (an answer to an earlier question, still on its way,
        would pass for this one's): a first answer takes openbox tens of ms, later ones about 1 ms."""
        self._asker.delete_property(self._answer)
        question = ClientMessage(window=self._asker, client_type=self._question, data=(32, [0, 0, 0, 0, 0]))
        self._root.send_event(question, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)

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
