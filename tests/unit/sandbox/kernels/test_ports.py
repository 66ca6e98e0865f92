"""A starting kernel's ports: found after the per-start tag in whatever it prints, bounded."""

from __future__ import annotations

import pytest

from corral.sandbox.kernels import ports
from corral.sandbox.kernels.ports import Ports, StartOutput

LINE = b'{"shell": 40001, "iopub": 40002, "control": 40003}'


def test_the_tagged_line_is_found_across_chunks_among_other_output() -> None:
    out = StartOutput("t0k")
    out.feed(b"a warning\n" + b'\nt1k {"shell": 1, "iopub": 2, "control": 3}\n')  # another start's tag
    out.feed(b"\nt0k " + LINE[:10])
    assert not out.found.is_set()
    out.feed(LINE[10:] + b"\nmore")
    assert out.found.is_set() and out.line == LINE
    assert Ports.parse(out.line) == Ports(40001, 40002, 40003)


def test_what_is_kept_while_looking_is_bounded() -> None:
    out = StartOutput("tag")
    for _ in range(100):
        out.feed(b"x" * 1000)
    out.feed(b"\ntag " + LINE + b"\n")
    assert out.line is None and len(out.text) == ports.MAX_START_OUTPUT
    assert len(out.tail()) <= 2000


@pytest.mark.parametrize(
    "line",
    [
        b"[1, 2, 3]",
        b'{"shell": 0, "iopub": 2, "control": 3}',
        b'{"shell": 70000, "iopub": 2, "control": 3}',
        b'{"shell": true, "iopub": 2, "control": 3}',
        b'{"shell": "1", "iopub": 2, "control": 3}',
        b'{"iopub": 2, "control": 3}',
        b"not json",
        b"{" + b" " * ports.MAX_PORTS_LINE + b"}",
    ],
)
def test_a_line_that_is_not_three_ports_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        Ports.parse(line)
