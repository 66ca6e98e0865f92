"""Checking a mitmproxy flow file (a recording's ``responses.mitm``) without mitmproxy.

The file is a sequence of tnetstrings (``<length>:<payload><type>``), one dictionary (``}``) per
flow whose ``type`` is ``http``. The proxy (cutting a torn tail before it appends), the gateway
and the CLI only need to know that a file is one, how many flows it holds and where its last
complete flow ends (a killed proxy can tear the last one); mitmproxy itself reads the flows.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LENGTH_DIGITS = 12  # a flow of up to a terabyte; anything longer is no flow file


@dataclass(frozen=True, slots=True)
class FlowFile:
    flows: int
    complete: int  # bytes up to the end of the last complete flow
    torn: bool  # bytes after it: a flow cut short


def _element(view: memoryview, position: int, end: int) -> tuple[int, int, int] | None:
    """One tnetstring at ``position``: (payload start, payload end, type byte), or None."""
    head = bytes(view[position : min(end, position + MAX_LENGTH_DIGITS + 1)])
    colon = head.find(b":")
    if colon <= 0 or not head[:colon].isdigit():
        return None
    start = position + colon + 1
    stop = start + int(head[:colon])
    return (start, stop, view[stop]) if stop < end else None


def _is_http_flow(view: memoryview, start: int, end: int) -> bool:
    """Whether the dictionary payload in ``view[start:end]`` has ``"type": "http"``."""
    position = start
    while position < end:
        key = _element(view, position, end)
        if key is None:
            return False
        value = _element(view, key[1] + 1, end)
        if value is None:
            return False
        if bytes(view[key[0] : key[1]]) == b"type":
            return bytes(view[value[0] : value[1]]) == b"http" and value[2] in b";,"
        position = value[1] + 1
    return False


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
        start = position + colon + 1
        end = start + int(head[:colon])
        if end >= size:
            return FlowFile(flows, position, True)  # the last flow was cut short
        if view[end] != ord("}") or not _is_http_flow(view, start, end):
            raise ValueError(f"not a mitmproxy flow file (the record at byte {position} is no HTTP flow)")
        position = end + 1
        flows += 1
    return FlowFile(flows, position, False)
