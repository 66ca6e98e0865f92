"""The browser's state (cookies, local storage, IndexedDB) out of a sandbox and into one: one ``docker
exec`` as the browser's uid (the only one that may read its profile) of corral.sandbox.web.stateswap,
the archive on its stdout or stdin. What comes back is a sandbox's, so it is read bounded (the archive
to its cap, the reason to a few KiB) and never unpacked here: only a sandbox unpacks an archive."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import docker
import docker.errors

from corral.errors import ProfileRefused, ProfileTooLarge, SandboxError, StreamLimit
from corral.runtime.docker.engine import Engine

BROWSER_USER = "browser"
PYTHON = "/opt/corral/bin/python"
STATESWAP = [PYTHON, "-P", "-m", "corral.sandbox.web.stateswap"]
EXIT_TOO_LARGE, EXIT_REFUSED = 3, 4  # corral.sandbox.web.stateswap's
STDERR_MAX = 8 << 10
_HEADER = struct.Struct(">BxxxI")  # Docker's multiplexed stream: kind (1 out, 2 err), size


def demultiplex(frames: bytes, out_max: int) -> tuple[bytes, bytes]:
    """stdout and stderr of Docker's multiplexed stream (stderr cut to :data:`STDERR_MAX`);
    :class:`StreamLimit` when stdout passes ``out_max``. Pure."""
    out, err = bytearray(), bytearray()
    at = 0
    while at + _HEADER.size <= len(frames):
        kind, size = _HEADER.unpack_from(frames, at)
        at += _HEADER.size
        chunk = frames[at : at + size]
        at += size
        if kind == 1:
            out += chunk
            if len(out) > out_max:
                raise StreamLimit(f"more than {out_max} bytes")
        elif kind == 2 and len(err) < STDERR_MAX:
            err += chunk[: STDERR_MAX - len(err)]
    return bytes(out), bytes(err)


class BrowserStates(Engine):
    """Export and import of a sandbox's browser state; each bounded in bytes and time."""

    def export_browser_state(self, ident: str, max_bytes: int, timeout_s: float = 60.0) -> bytes:
        out = self._stateswap(ident, ["export", str(max_bytes)], b"", max_bytes, timeout_s)
        return out

    def import_browser_state(self, ident: str, archive: bytes, max_bytes: int, timeout_s: float = 60.0) -> int:
        out = self._stateswap(ident, ["import", str(max_bytes)], archive, 64, timeout_s)
        text = out.decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0

    def _stateswap(self, ident: str, args: list[str], stdin: bytes, out_max: int, timeout_s: float) -> bytes:
        try:
            code, out, err = self._exec_piped(ident, [*STATESWAP, *args], stdin, out_max, timeout_s)
        except StreamLimit:
            raise ProfileTooLarge(f"the sandbox's browser state is over {out_max} bytes") from None
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxError(f"cannot reach the browser's state in {ident[:12]}: {exc}") from None
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {code}"]
        if code == EXIT_TOO_LARGE:
            raise ProfileTooLarge(f"{reason[0]} (CORRAL_PROFILE_MAX_MB)")
        if code == EXIT_REFUSED:
            raise ProfileRefused(f"the sandbox refused the profile: {reason[0]}")
        if code != 0:
            raise ProfileRefused(f"the browser's state could not be moved: {reason[0]}")
        return out

    def _exec_piped(
        self, ident: str, argv: list[str], stdin: bytes, out_max: int, timeout_s: float
    ) -> tuple[int, bytes, bytes]:
        """One exec as the browser's uid, ``stdin`` written and closed, its output read to its bound
        within ``timeout_s``; (exit code, stdout, stderr)."""
        api = self.client.api
        created = api.exec_create(ident, argv, stdin=True, stdout=True, stderr=True, user=BROWSER_USER)
        exec_id = created["Id"]
        stream: Any = api.exec_start(exec_id, socket=True)
        raw: socket.socket = stream._sock
        deadline = time.monotonic() + timeout_s
        limit = out_max + STDERR_MAX + (1 << 16)  # the frames' headers and a little slack
        try:
            raw.settimeout(timeout_s)
            if stdin:
                raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
            frames = bytearray()
            while chunk := raw.recv(1 << 16):
                frames += chunk
                if len(frames) > limit + out_max:
                    raise StreamLimit(f"more than {out_max} bytes")
                if time.monotonic() > deadline:
                    raise SandboxError(f"the browser's state took over {timeout_s:.0f}s")
        except TimeoutError:
            raise SandboxError(f"the browser's state took over {timeout_s:.0f}s") from None
        finally:
            raw.close()
        out, err = demultiplex(bytes(frames), out_max)
        code = api.exec_inspect(exec_id).get("ExitCode")
        return (int(code) if code is not None else -1), out, err
