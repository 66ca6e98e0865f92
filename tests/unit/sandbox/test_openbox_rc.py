"""openbox's configuration as the image build makes it (images/desktop/openbox_rc.py): no binding
starts a program, whoever drives the screen."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "images" / "desktop" / "openbox_rc.py"
NS = "{http://openbox.org/3.4/rc}"

# The shape of Debian's rc.xml: key and mouse bindings that run programs, open the root menu or
# restart openbox, beside the window bindings that must stay.
DEBIAN_LIKE = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc" xmlns:xi="http://www.w3.org/2001/XInclude">
<theme><name>Clearlooks</name></theme>
<keyboard>
  <keybind key="A-F4"><action name="Close"/></keybind>
  <keybind key="A-space"><action name="ShowMenu"><menu>client-menu</menu></action></keybind>
  <keybind key="A-Print"><action name="Execute"><command>scrot -s</command></action></keybind>
  <keybind key="W-e"><action name="Execute"><startupnotify><enabled>true</enabled></startupnotify>
    <command>kfmclient openProfile filemanagement</command></action></keybind>
  <keybind key="C-A-r"><action name="Restart"><command>xterm</command></action></keybind>
</keyboard>
<mouse>
  <context name="Root">
    <mousebind button="Middle" action="Press">
      <action name="ShowMenu"><menu>client-list-combined-menu</menu></action></mousebind>
    <mousebind button="Right" action="Press"><action name="ShowMenu"><menu>root-menu</menu></action></mousebind>
  </context>
  <context name="Titlebar">
    <mousebind button="Left" action="Drag"><action name="Move"/></mousebind>
  </context>
</mouse>
<menu><file>/var/lib/openbox/debian-menu.xml</file><file>menu.xml</file><hideDelay>200</hideDelay></menu>
</openbox_config>
"""


@pytest.fixture(scope="module")
def openbox_rc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openbox_rc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_binding_starts_a_program_and_the_window_bindings_stay(openbox_rc: ModuleType) -> None:
    root = ET.fromstring(openbox_rc.locked_down(DEBIAN_LIKE, "/usr/share/corral/openbox/menu.xml"))
    actions = [a.get("name") for a in root.iter(f"{NS}action")]
    assert "Execute" not in actions and "Restart" not in actions
    menus = [m.text for a in root.iter(f"{NS}action") if (m := a.find(f"{NS}menu")) is not None]
    assert sorted(menus) == ["client-list-combined-menu", "client-menu"]  # a window's own, the window list
    assert [k.get("key") for k in root.iter(f"{NS}keybind")] == ["A-F4", "A-space"]
    assert "Move" in actions and root.find(f"{NS}theme/{NS}name").text == "Clearlooks"  # type: ignore[union-attr]
    assert [f.text for f in root.iter(f"{NS}file")] == ["/usr/share/corral/openbox/menu.xml"]


def test_the_build_writes_an_empty_menu_beside_the_rc(openbox_rc: ModuleType, tmp_path: Path) -> None:
    source = tmp_path / "rc.xml"
    source.write_text(DEBIAN_LIKE)
    assert openbox_rc.main(["openbox_rc.py", str(source), str(tmp_path / "out")]) == 0
    menu = ET.fromstring((tmp_path / "out" / "menu.xml").read_text())
    assert list(menu) == []
    assert "Execute" not in (tmp_path / "out" / "rc.xml").read_text()
