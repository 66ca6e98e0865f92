"""What a starting kernel tells the controller, pure: the boot's line (:mod:`corral.sandbox.kernels.boot`),
a per-start tag and then the ports it bound, found in what the kernel prints as it starts (both
streams, bounded), and read as :class:`Ports`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

MAX_PORTS_LINE = 1024
MAX_START_OUTPUT = 16 << 10  # what a starting kernel printed, kept to find its ports (and to explain a failure)


@dataclass(frozen=True, slots=True)
class Ports:
    """Where a kernel listens on 127.0.0.1, as its boot printed them."""

    shell: int
    iopub: int
    control: int

    @classmethod
    def parse(cls, line: bytes) -> Ports:
        """The boot's first stdout line (:mod:`corral.sandbox.kernels.boot`), or ValueError."""
        if len(line) > MAX_PORTS_LINE:
            raise ValueError("the kernel's ports line is too long")
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("the kernel's ports are not a JSON object")
        ports = [data.get(name) for name in ("shell", "iopub", "control")]
        for port in ports:
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise ValueError(f"not a port: {port!r}")
        shell, iopub, control = ports
        assert isinstance(shell, int) and isinstance(iopub, int) and isinstance(control, int)
        return cls(shell, iopub, control)


class StartOutput:
    """What a starting kernel prints (both streams, as the table's tap hands them), searched for
    the boot's line: the tag, then the ports."""

    def __init__(self, tag: str) -> None:
        self._tag = b"\n" + tag.encode() + b" "
        self.text = bytearray()
        self.line: bytes | None = None
        self.found = asyncio.Event()

    def feed(self, chunk: bytes) -> None:
        if self.line is not None or len(self.text) >= MAX_START_OUTPUT:
            return
        self.text += chunk[: MAX_START_OUTPUT - len(self.text)]
        at = self.text.find(self._tag)
        end = self.text.find(b"\n", at + len(self._tag)) if at >= 0 else -1
        if end >= 0:
            self.line = bytes(self.text[at + len(self._tag) : end])
            self.found.set()

    def tail(self, limit: int = 2000) -> str:
        return bytes(self.text[-limit:]).decode(errors="replace").strip()
