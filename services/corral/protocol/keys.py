"""xdotool key syntax: ``ctrl+shift+t``, ``Return``, ``alt+F4 Escape``.

Pure parsing, no X connection: names become X keysyms here and the sandbox's
input module turns keysyms into keycodes. Exact keysym names win; then a
case-insensitive match; then the aliases agents commonly send (``enter``,
``cmd``, ``ARROWLEFT``...). Single characters stay case-sensitive, as in xdotool
(``ctrl+T`` means ctrl+shift+t).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from Xlib import XK

from corral.errors import UnknownKeyError

for _group in ("xkb", "xf86", "latin2", "latin3", "latin4", "greek", "cyrillic", "publishing", "technical"):
    XK.load_keysym_group(_group)

_ALIASES: dict[str, str] = {
    "ctrl": "Control_L",
    "control": "Control_L",
    "lctrl": "Control_L",
    "rctrl": "Control_R",
    "shift": "Shift_L",
    "lshift": "Shift_L",
    "rshift": "Shift_R",
    "alt": "Alt_L",
    "lalt": "Alt_L",
    "ralt": "Alt_R",
    "option": "Alt_L",
    "opt": "Alt_L",
    "altgr": "ISO_Level3_Shift",
    "meta": "Meta_L",
    "super": "Super_L",
    "cmd": "Super_L",
    "command": "Super_L",
    "win": "Super_L",
    "windows": "Super_L",
    "enter": "Return",
    "return": "Return",
    "esc": "Escape",
    "escape": "Escape",
    "del": "Delete",
    "delete": "Delete",
    "backspace": "BackSpace",
    "bksp": "BackSpace",
    "tab": "Tab",
    "space": "space",
    "spacebar": "space",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "arrowup": "Up",
    "arrowdown": "Down",
    "arrowleft": "Left",
    "arrowright": "Right",
    "pgup": "Prior",
    "pageup": "Prior",
    "page_up": "Prior",
    "pgdn": "Next",
    "pagedown": "Next",
    "page_down": "Next",
    "ins": "Insert",
    "capslock": "Caps_Lock",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "printscreen": "Print",
    "prtsc": "Print",
    "contextmenu": "Menu",
    "plus": "plus",
    "minus": "minus",
}

MODIFIER_KEYSYM_NAMES = frozenset(
    {
        "Control_L",
        "Control_R",
        "Shift_L",
        "Shift_R",
        "Alt_L",
        "Alt_R",
        "Meta_L",
        "Meta_R",
        "Super_L",
        "Super_R",
        "Hyper_L",
        "Hyper_R",
        "ISO_Level3_Shift",
    }
)

# Characters that stand for a key of their own when typed.
_CONTROL_CHARS: dict[str, str] = {"\n": "Return", "\r": "Return", "\t": "Tab", "\b": "BackSpace", "\x1b": "Escape"}


@dataclass(frozen=True, slots=True)
class Key:
    """One key: the keysym name and value xdotool would use."""

    name: str
    keysym: int

    @property
    def is_modifier(self) -> bool:
        return self.name in MODIFIER_KEYSYM_NAMES


@dataclass(frozen=True, slots=True)
class KeyCombo:
    """Keys pressed in order and released in reverse (``ctrl+shift+t``)."""

    keys: tuple[Key, ...]

    def __str__(self) -> str:
        return "+".join(k.name for k in self.keys)


@cache
def _names_by_lower() -> dict[str, str]:
    table: dict[str, str] = {}
    for attr in dir(XK):
        if attr.startswith("XK_") and len(attr) > 4:
            table.setdefault(attr[3:].lower(), attr[3:])
    return table


def keysym_for_char(char: str) -> int:
    """The keysym that types ``char`` (Latin-1 directly, the rest as Unicode keysyms)."""
    if len(char) != 1:
        raise ValueError(f"expected one character, got {char!r}")
    if char in _CONTROL_CHARS:
        return int(XK.string_to_keysym(_CONTROL_CHARS[char]))
    code = ord(char)
    if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
        raise ValueError(f"control character U+{code:04X} cannot be typed")
    if 0xD800 <= code <= 0xDFFF:
        raise ValueError(f"lone surrogate U+{code:04X} cannot be typed")
    if code <= 0xFF:
        return code
    return 0x01000000 + code


def parse_key(token: str, combo: str | None = None) -> Key:
    """One key name (``Return``, ``ctrl``, ``a``, ``F5``, ``é``) to a :class:`Key`."""
    if not token:
        raise UnknownKeyError(token, combo or token)
    if len(token) == 1:
        if token == " ":
            return Key("space", 0x20)
        try:
            return Key(token, keysym_for_char(token))
        except ValueError:
            raise UnknownKeyError(token, combo or token) from None
    if token.startswith("XF86") and not token.startswith("XF86_"):
        # python-xlib spells X's XF86AudioMute as XF86_AudioMute.
        token = "XF86_" + token[4:]
    name = token if XK.string_to_keysym(token) else None
    if name is None:
        lowered = token.lower()
        name = _ALIASES.get(lowered) or _names_by_lower().get(lowered)
    if name is None:
        raise UnknownKeyError(token, combo or token)
    return Key(name, int(XK.string_to_keysym(name)))


def parse_combo(text: str) -> KeyCombo:
    """``ctrl+shift+t`` to a :class:`KeyCombo`; ``ctrl++`` means ctrl and plus."""
    if not text or text.strip() != text:
        raise UnknownKeyError(text, text)
    if text == "+":
        return KeyCombo((parse_key("plus"),))
    parts = text.split("+")
    if parts[-1] == "" and len(parts) >= 2:
        # "ctrl++": a trailing empty part means the '+' key itself.
        parts = [*parts[:-2], "plus"] if parts[-2] == "" else parts
    keys = tuple(parse_key(part, text) for part in parts)
    return KeyCombo(keys)


def parse_sequence(text: str) -> tuple[KeyCombo, ...]:
    """Space-separated combos, as ``xdotool key`` takes them: ``ctrl+a BackSpace``."""
    tokens = text.split()
    if not tokens:
        raise UnknownKeyError(text, text)
    return tuple(parse_combo(token) for token in tokens)
