"""openbox's configuration for the sandbox, made at image build from Debian's: nothing in it starts a
program.

openbox runs as the browser's uid (corral.sandbox.startup.init), a trusted X client beside Chromium. Debian's
rc.xml binds keys to programs (Print runs scrot, W-e a file manager) and the desktop's right button to
the root menu (a terminal, a browser, "Restart" with another window manager): each a way for whoever
drives the screen (the agent, through the controller's input) to start a program as that uid, which
could then trace Chromium or use the X server as a trusted client. This keeps Debian's look and every
window binding, drops every binding that runs a program or opens a menu other than a window's own,
and points the menus at an empty file.

    python3 openbox_rc.py SOURCE_RC TARGET_DIR   (writes TARGET_DIR/rc.xml and TARGET_DIR/menu.xml)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

NAMESPACE = "http://openbox.org/3.4/rc"
EMPTY_MENU = '<?xml version="1.0" encoding="UTF-8"?>\n<openbox_menu xmlns="http://openbox.org/3.4/menu"/>\n'
# Actions that start a program or reach one: Execute; Restart and Exit (Restart may name another
# window manager to run); ShowMenu of any menu but a window's own (the root menu runs programs).
STARTS_PROGRAMS = {"Execute", "Restart", "Exit", "SessionLogout"}
HARMLESS_MENUS = {"client-menu", "client-list-combined-menu"}


def _tag(name: str) -> str:
    return f"{{{NAMESPACE}}}{name}"


def _starts_programs(binding: ET.Element) -> bool:
    for action in binding.iter(_tag("action")):
        name = action.get("name", "")
        if name in STARTS_PROGRAMS:
            return True
        if name == "ShowMenu":
            menu = action.find(_tag("menu"))
            if menu is None or (menu.text or "").strip() not in HARMLESS_MENUS:
                return True
    return False


def locked_down(rc_xml: str, menu_file: str) -> str:
    """Debian's rc.xml without a binding that starts a program, its menus one empty file."""
    ET.register_namespace("", NAMESPACE)
    root = ET.fromstring(rc_xml)
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag in (_tag("keybind"), _tag("mousebind")) and _starts_programs(child):
                parent.remove(child)
    menu = root.find(_tag("menu"))
    if menu is None:
        menu = ET.SubElement(root, _tag("menu"))
    for listed in menu.findall(_tag("file")):
        menu.remove(listed)
    only = ET.Element(_tag("file"))
    only.text = menu_file
    menu.insert(0, only)
    text = ET.tostring(root, encoding="unicode")
    if "Execute" in text or "root-menu" in text:
        raise ValueError("a binding that starts a program is left")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + text + "\n"


def main(argv: list[str]) -> int:
    source, target = Path(argv[1]), Path(argv[2])
    target.mkdir(parents=True, exist_ok=True)
    menu = target / "menu.xml"
    menu.write_text(EMPTY_MENU)
    (target / "rc.xml").write_text(locked_down(source.read_text(), str(menu)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
