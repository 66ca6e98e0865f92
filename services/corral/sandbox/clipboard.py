"""The X CLIPBOARD selection through xclip (argument lists only; xclip serves the selection it sets)."""

from __future__ import annotations

import asyncio
import os

from corral.errors import ActionError, ErrorCode

_TIMEOUT_S = 5.0


async def _xclip(args: list[str], stdin: bytes | None, display: str) -> tuple[int, bytes, bytes]:
    # When setting, xclip forks a child that serves the selection and keeps inherited pipes open:
    # capture output only when reading.
    capture = asyncio.subprocess.PIPE if stdin is None else asyncio.subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(
        "xclip",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=capture,
        stderr=capture,
        # The controller's cookie (corral.sandbox.xaccess): xclip is a trusted client, as it is.
        env={"DISPLAY": display, **{k: v for k, v in os.environ.items() if k == "XAUTHORITY"}},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), _TIMEOUT_S)
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
    code, _, _ = await _xclip(["-selection", "clipboard", "-in"], text.encode(), display)
    if code != 0:
        raise ActionError(ErrorCode.CLIPBOARD_FAILED, f"xclip exited with {code}")


async def clear(display: str) -> None:
    """Both selections emptied (CLIPBOARD and PRIMARY): what a person copied or selected in their turn
    is gone before the agent's processes run again (corral.sandbox.freezer). xclip takes each selection
    over with nothing in it, so whichever client held it (Chromium) no longer serves it."""
    for selection in ("clipboard", "primary"):
        code, _, _ = await _xclip(["-selection", selection, "-in"], b"", display)
        if code != 0:
            raise ActionError(ErrorCode.CLIPBOARD_FAILED, f"xclip could not empty the {selection} selection ({code})")
