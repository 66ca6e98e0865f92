"""Docker's multiplexed exec stream, read to a bound (the sandbox decides how much it writes)."""

from __future__ import annotations

import struct

import pytest

from corral.errors import StreamLimit
from corral.runtime.docker.browserstate import STDERR_MAX, demultiplex


def _frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", kind, len(data)) + data


def test_stdout_and_stderr_are_told_apart() -> None:
    frames = _frame(1, b"arch") + _frame(2, b"why\n") + _frame(1, b"ive")
    assert demultiplex(frames, 100) == (b"archive", b"why\n")


def test_stdout_past_its_bound_is_refused_and_stderr_is_cut() -> None:
    with pytest.raises(StreamLimit):
        demultiplex(_frame(1, b"x" * 11), 10)
    _, err = demultiplex(_frame(2, b"e" * (STDERR_MAX + 100)), 10)
    assert len(err) == STDERR_MAX
