"""The flow-file check the gateway and the CLI use (mitmproxy itself reads the flows in the proxy)."""

from __future__ import annotations

import pytest

from corral.proxy.flowfile import FlowFile, check

# Two flows as mitmproxy's tnetstring writer lays them out (a dictionary each), cut nowhere.
FLOW = b"25:2:id;3:abc;4:type;4:http;}"
TWO = FLOW + FLOW


def test_whole_files_count_their_flows() -> None:
    assert check(TWO) == FlowFile(2, len(TWO), False)
    assert check(b"") == FlowFile(0, 0, False)


@pytest.mark.parametrize("cut", [1, 2, 3, 10, len(FLOW) - 1])
def test_a_torn_last_flow_is_found_and_left_out(cut: int) -> None:
    assert check(TWO[: len(FLOW) + cut]) == FlowFile(1, len(FLOW), True)


@pytest.mark.parametrize(
    "data",
    [
        b"PK\x03\x04 a zip",
        b'{"json": true}',
        b"5:hello,",
        FLOW + b"junk",
        b"x" * 40,
        b":1",
        b"0:}",  # a dictionary, but no flow
        b"24:2:id;3:abc;4:type;3:tcp;}",  # a flow, but not HTTP
        b"12:4:type;99:h;}",  # a length running past its dictionary
    ],
)
def test_foreign_data_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a mitmproxy flow file"):
        check(data)
