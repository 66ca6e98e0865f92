"""xdotool key syntax: key names, aliases, characters, combos and sequences."""

from __future__ import annotations

import re

import pytest
from Xlib import XK

from corral.protocol.keys import (
    MODIFIER_KEYSYM_NAMES,
    Key,
    KeyCombo,
    UnknownKeyError,
    keysym_for_char,
    parse_combo,
    parse_key,
    parse_sequence,
)


def keysym(name: str) -> int:
    value = int(XK.string_to_keysym(name))
    assert value, f"test bug: {name} is no keysym"
    return value


@pytest.mark.parametrize(
    "token",
    [
        "Return",
        "Escape",
        "BackSpace",
        "Tab",
        "F5",
        "F12",
        "Page_Down",
        "Home",
        "End",
        "KP_Enter",
        "Control_L",
        "Super_R",
        "Delete",
        "space",
        "Left",
    ],
)
def test_exact_keysym_names_are_kept(token: str) -> None:
    key = parse_key(token)
    assert key == Key(token, keysym(token))


@pytest.mark.parametrize(
    ("token", "name"),
    [
        ("ctrl", "Control_L"),
        ("Ctrl", "Control_L"),
        ("CONTROL", "Control_L"),
        ("rctrl", "Control_R"),
        ("shift", "Shift_L"),
        ("SHIFT", "Shift_L"),
        ("rshift", "Shift_R"),
        ("alt", "Alt_L"),
        ("option", "Alt_L"),
        ("ralt", "Alt_R"),
        ("altgr", "ISO_Level3_Shift"),
        ("meta", "Meta_L"),
        ("super", "Super_L"),
        ("cmd", "Super_L"),
        ("command", "Super_L"),
        ("win", "Super_L"),
        ("enter", "Return"),
        ("ENTER", "Return"),
        ("esc", "Escape"),
        ("del", "Delete"),
        ("backspace", "BackSpace"),
        ("bksp", "BackSpace"),
        ("spacebar", "space"),
        ("SPACE", "space"),
        ("ARROWLEFT", "Left"),
        ("ArrowUp", "Up"),
        ("arrowdown", "Down"),
        ("arrowright", "Right"),
        ("pgup", "Prior"),
        ("PageUp", "Prior"),
        ("pgdn", "Next"),
        ("PAGE_DOWN", "Next"),
        ("ins", "Insert"),
        ("capslock", "Caps_Lock"),
        ("printscreen", "Print"),
        ("contextmenu", "Menu"),
        ("plus", "plus"),
        ("minus", "minus"),
    ],
)
def test_aliases(token: str, name: str) -> None:
    assert parse_key(token) == Key(name, keysym(name))


@pytest.mark.parametrize(
    ("token", "name"),
    [
        ("f5", "F5"),
        ("f12", "F12"),
        ("HOME", "Home"),
        ("kp_enter", "KP_Enter"),
        ("hyper_l", "Hyper_L"),
        ("TAB", "Tab"),
        ("RETURN", "Return"),
    ],
)
def test_case_insensitive_keysym_match(token: str, name: str) -> None:
    assert parse_key(token) == Key(name, keysym(name))


def test_xf86_names_are_spelled_the_python_xlib_way() -> None:
    key = parse_key("XF86AudioMute")
    assert key.name == "XF86_AudioMute"
    assert key.keysym == 0x1008FF12


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("a", 0x61),
        ("A", 0x41),
        ("T", 0x54),
        ("t", 0x74),
        ("1", 0x31),
        ("/", 0x2F),
        ("+", 0x2B),
        ("é", 0xE9),
        ("€", 0x010020AC),
    ],
)
def test_single_characters_are_case_sensitive(token: str, value: int) -> None:
    key = parse_key(token)
    assert key == Key(token, value)
    assert not key.is_modifier


def test_a_lone_space_is_the_space_key() -> None:
    assert parse_key(" ") == Key("space", 0x20)


@pytest.mark.parametrize("token", ["", "bogus", "ctrlx", "F99", "\x00", "\x7f", "Retrun"])
def test_unknown_keys(token: str) -> None:
    with pytest.raises(UnknownKeyError) as info:
        parse_key(token)
    assert info.value.token == token
    assert "unknown key" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_key_message_names_the_combo() -> None:
    with pytest.raises(UnknownKeyError) as info:
        parse_combo("ctrl+bogus")
    assert info.value.token == "bogus"
    assert "'bogus' in 'ctrl+bogus'" in str(info.value)


def test_unknown_key_message_without_combo_has_no_hint() -> None:
    with pytest.raises(UnknownKeyError) as info:
        parse_key("bogus")
    assert " in " not in str(info.value).split(";")[0]


@pytest.mark.parametrize(
    ("token", "modifier"),
    [
        ("ctrl", True),
        ("rctrl", True),
        ("shift", True),
        ("Shift_R", True),
        ("alt", True),
        ("Alt_R", True),
        ("meta", True),
        ("Meta_R", True),
        ("super", True),
        ("Super_R", True),
        ("Hyper_L", True),
        ("altgr", True),
        ("Return", False),
        ("a", False),
        ("Caps_Lock", False),
        ("F5", False),
        ("space", False),
    ],
)
def test_is_modifier(token: str, modifier: bool) -> None:
    key = parse_key(token)
    assert key.is_modifier is modifier
    assert (key.name in MODIFIER_KEYSYM_NAMES) is modifier


@pytest.mark.parametrize(
    ("char", "value"),
    [
        ("a", 0x61),
        ("Z", 0x5A),
        (" ", 0x20),
        ("~", 0x7E),
        ("\xa0", 0xA0),
        ("ÿ", 0xFF),
        ("Ā", 0x01000100),
        ("€", 0x010020AC),
        ("日", 0x010065E5),
        ("😀", 0x0101F600),
        ("\n", 0xFF0D),
        ("\r", 0xFF0D),
        ("\t", 0xFF09),
        ("\b", 0xFF08),
        ("\x1b", 0xFF1B),
    ],
)
def test_keysym_for_char(char: str, value: int) -> None:
    assert keysym_for_char(char) == value


@pytest.mark.parametrize(
    ("char", "message"),
    [
        ("\x00", "control character U+0000"),
        ("\x07", "control character U+0007"),
        ("\x1f", "control character U+001F"),
        ("\x7f", "control character U+007F"),
        ("\x80", "control character U+0080"),
        ("\x9f", "control character U+009F"),
        ("\ud800", "lone surrogate U+D800"),
        ("\udfff", "lone surrogate U+DFFF"),
        ("", "expected one character"),
        ("ab", "expected one character"),
    ],
)
def test_keysym_for_char_rejects(char: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        keysym_for_char(char)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("Return", ["Return"]),
        ("ctrl+shift+t", ["Control_L", "Shift_L", "t"]),
        ("ctrl+T", ["Control_L", "T"]),
        ("alt+F4", ["Alt_L", "F4"]),
        ("super+Left", ["Super_L", "Left"]),
        ("ctrl++", ["Control_L", "plus"]),
        ("ctrl+shift++", ["Control_L", "Shift_L", "plus"]),
        ("+", ["plus"]),
        ("ctrl+plus", ["Control_L", "plus"]),
        ("cmd+a", ["Super_L", "a"]),
        ("XF86AudioMute", ["XF86_AudioMute"]),
    ],
)
def test_parse_combo(text: str, names: list[str]) -> None:
    combo = parse_combo(text)
    assert isinstance(combo, KeyCombo)
    assert [k.name for k in combo.keys] == names
    assert str(combo) == "+".join(names)


def test_combo_keys_carry_keysyms_in_press_order() -> None:
    combo = parse_combo("ctrl+T")
    assert [k.keysym for k in combo.keys] == [keysym("Control_L"), 0x54]


@pytest.mark.parametrize("text", ["", " ", " ctrl", "ctrl ", "ctrl+", "ctrl+bogus", "+ctrl", "\tReturn"])
def test_parse_combo_rejects(text: str) -> None:
    with pytest.raises(UnknownKeyError):
        parse_combo(text)


@pytest.mark.parametrize(
    ("text", "combos"),
    [
        ("Return", ["Return"]),
        ("ctrl+a BackSpace", ["Control_L+a", "BackSpace"]),
        ("alt+F4 Escape", ["Alt_L+F4", "Escape"]),
        ("  Tab   Tab\n", ["Tab", "Tab"]),
        ("ctrl++ minus", ["Control_L+plus", "minus"]),
    ],
)
def test_parse_sequence(text: str, combos: list[str]) -> None:
    assert [str(c) for c in parse_sequence(text)] == combos


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "Return bogus"])
def test_parse_sequence_rejects(text: str) -> None:
    with pytest.raises(UnknownKeyError):
        parse_sequence(text)


def test_key_and_combo_are_hashable_values() -> None:
    assert parse_key("ctrl") == parse_key("Control_L")
    assert {parse_combo("ctrl+a"), parse_combo("control+a")} == {parse_combo("ctrl+a")}
