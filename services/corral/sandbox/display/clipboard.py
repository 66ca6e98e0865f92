"""The X CLIPBOARD selection through xclip (argument lists only; xclip serves the selection it sets)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from Xlib.display import Display
from Xlib.error import ConnectionClosedError, DisplayError, XError

from corral.errors import ActionError, ErrorCode

_TIMEOUT_S = 5.0
# By the base's path: the controller's uid must never run a template's program (/usr/local/bin
# comes first on PATH; corral.gateway.templates.check keeps this file the base's).
XCLIP = "/usr/bin/xclip"
_SELECTIONS = ("clipboard", "primary")
_ATOMS = ("CLIPBOARD", "PRIMARY")
SETTLE_S = 0.5  # how long the emptied selections must keep their owner before the agent runs again
_CLEAR_ROUNDS = 5
OWNER_POLL_S = 0.01


async def _xclip(args: list[str], stdin: bytes | None, display: str) -> tuple[int, bytes, bytes]:
    # When setting, xclip forks a child that serves the selection and keeps inherited pipes open:
    # capture output only when reading.
    capture = asyncio.subprocess.PIPE if stdin is None else asyncio.subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(
        XCLIP,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=capture,
        stderr=capture,
        # The controller's cookie (corral.sandbox.display.xaccess): xclip is a trusted client, as it is.
        env={"DISPLAY": display, **{k: v for k, v in os.environ.items() if k == "XAUTHORITY"}},
    )
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ActionError(ErrorCode.CLIPBOARD_FAILED, "xclip did not answer in time") from None
    return proc.returncode or 0, out or b"", err or b""


async def get_text(display: str) -> str:
    code, out, err = await _xclip(["-selection", "clipboard", "-out"], None, display)
    if code != 0:
        if b"not available" in err or b"no owner" in err.lower():
            return ""  # nothing has been copied yet
        raise ActionError(ErrorCode.CLIPBOARD_FAILED, err.decode(errors="replace").strip() or "xclip failed")
    return out.decode(errors="replace")


async def set_text(display: str, text: str) -> None:
    """``text`` on the CLIPBOARD, answered once the X server names xclip's window its owner."""
    await _take(display, 0, text.encode())


async def _take(display: str, index: int, data: bytes) -> None:
    """``data`` on the selection ``_SELECTIONS[index]``, returned once the X server names xclip's window
    its owner: xclip's parent exits as its child takes the selection, and a read made before the child's
    request reached the server found the owner before it (or none: an empty clipboard, seen with the
    host under load)."""
    selection = _SELECTIONS[index]
    before = (await asyncio.to_thread(_owners, display))[index]
    code, _, _ = await _xclip(["-selection", selection, "-in"], data, display)
    if code != 0:
        raise ActionError(ErrorCode.CLIPBOARD_FAILED, f"xclip could not take {selection} ({code})")
    deadline = asyncio.get_running_loop().time() + _TIMEOUT_S
    while (await asyncio.to_thread(_owners, display))[index] in (0, before):
        if asyncio.get_running_loop().time() > deadline:
            raise ActionError(ErrorCode.CLIPBOARD_FAILED, f"xclip did not take {selection} in time")
        await asyncio.sleep(OWNER_POLL_S)


async def clear(display: str) -> None:
    """Both selections emptied (CLIPBOARD and PRIMARY): what a person copied or selected in their turn
    is gone before the agent's processes run again (corral.sandbox.agent.freezer). xclip takes each selection
    over with nothing in it, so whichever client held it (Chromium) no longer serves it. A person's last
    ctrl+c may reach Chromium's clipboard after their hand-back (the browser takes the selection once
    the page answered), so the owners must hold still for :data:`SETTLE_S` after the emptying, which is
    done again when they did not."""
    for _ in range(_CLEAR_ROUNDS):
        # Each emptying's owner named before the settle starts: read earlier, a selection still on its
        # way to xclip's child looked like one changing hands and the emptying ran again.
        for index in range(len(_SELECTIONS)):
            await _take(display, index, b"")
        emptied = await asyncio.to_thread(_owners, display)
        await asyncio.sleep(SETTLE_S)
        if await asyncio.to_thread(_owners, display) == emptied:
            return
    raise ActionError(ErrorCode.CLIPBOARD_FAILED, "the selections kept changing hands while they were emptied")


def _owners(display: str) -> tuple[int, ...]:
    """Which window owns each selection now (0: none), over a connection of the controller's own."""
    try:
        connection = Display(display)
        try:
            return tuple(_window_id(connection.get_selection_owner(connection.intern_atom(name))) for name in _ATOMS)
        finally:
            connection.close()
    except (DisplayError, ConnectionClosedError, XError, OSError) as exc:
        raise ActionError(
            ErrorCode.CLIPBOARD_FAILED, f"the X server did not name the selections' owners: {exc}"
        ) from None


def _window_id(owner: Any) -> int:
    """python-xlib answers a window object, or X.NONE (0) when nobody owns the selection."""
    return int(getattr(owner, "id", 0) if owner else 0)
