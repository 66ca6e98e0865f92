"""Chromium asked to quit the way a person quits it: WM_DELETE_WINDOW to each of its windows, over X as
the browser's uid (which the X server lets in by name). The last window closed, Chromium shuts down
in full: its profile is torn down, so its cookie store and local storage commit what they hold
(a SIGTERM ends it through its session-ending path, which skips both; docs/design/0326)."""

from __future__ import annotations

from Xlib import X
from Xlib.display import Display
from Xlib.error import DisplayError, XError
from Xlib.protocol import event
from Xlib.xobject.drawable import Window

DISPLAY = ":0"


def _windows(root: Window, depth: int = 3) -> list[Window]:
    """Every window under ``root`` to ``depth`` levels (openbox frames hold the clients one level down)."""
    found: list[Window] = []
    for child in root.query_tree().children:
        found.append(child)
        if depth > 1:
            found.extend(_windows(child, depth - 1))
    return found


def close_windows(pids: set[int]) -> int:
    """WM_DELETE_WINDOW to each window of a process in ``pids`` that takes it; how many were asked.
    0 when the X server cannot be reached (the caller stops Chromium with a signal instead)."""
    try:
        display = Display(DISPLAY)
    except (DisplayError, OSError, XError):
        return 0
    try:
        protocols = display.intern_atom("WM_PROTOCOLS")
        delete = display.intern_atom("WM_DELETE_WINDOW")
        wm_pid = display.intern_atom("_NET_WM_PID")
        asked = 0
        for window in _windows(display.screen().root):
            try:
                owner = window.get_full_property(wm_pid, X.AnyPropertyType)
                if owner is None or not owner.value or int(owner.value[0]) not in pids:
                    continue
                if delete not in (window.get_wm_protocols() or []):
                    continue
                message = event.ClientMessage(
                    window=window, client_type=protocols, data=(32, [delete, X.CurrentTime, 0, 0, 0])
                )
                window.send_event(message)
                asked += 1
            except XError:
                continue  # a window gone meanwhile
        display.flush()
        return asked
    finally:
        display.close()
