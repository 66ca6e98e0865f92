"""Checking a mitmproxy flow file (a recording's ``responses.mitm``) without mitmproxy.

The file is a sequence of tnetstrings (``<length>:<payload><type>``), one dictionary (``}``) per
flow. The gateway and the CLI only need to know that a file is one, how many flows it holds and
where its last complete flow ends (a killed proxy can tear the last one); mitmproxy itself reads
the flows in the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LENGTH_DIGITS = 12  # a flow of up to a terabyte; anything longer is no flow file


@dataclass(frozen=True, slots=True)
class FlowFile:
    flows: int
    complete: int  # bytes up to the end of the last complete flow
    torn: bool  # bytes after it: a flow cut short


def check(data: bytes | memoryview) -> FlowFile:
    """Walk the top-level tnetstrings; raises ValueError when the data is not a flow file."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    size = len(view)
    position = flows = 0
    while position < size:
        head = bytes(view[position : position + MAX_LENGTH_DIGITS + 1])
        colon = head.find(b":")
        if colon < 0 and position + len(head) == size and head.isdigit():
            return FlowFile(flows, position, True)  # cut short inside the length
        if colon <= 0 or not head[:colon].isdigit():
            raise ValueError(f"not a mitmproxy flow file (no tnetstring at byte {position})")
        end = position + colon + 1 + int(head[:colon])
        if end >= size:
            return FlowFile(flows, position, True)  # the last flow was cut short
        if view[end] != ord("}"):
            raise ValueError(f"not a mitmproxy flow file (the record at byte {position} is not a dictionary)")
        position = end + 1
        flows += 1
    return FlowFile(flows, position, False)
