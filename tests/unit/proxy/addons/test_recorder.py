"""Response recording (corral.proxy.addons.recorder): every answer the policy let through is kept,
named by its vetted host, its request's credentials blanked; refusals are no upstream answers."""

from __future__ import annotations

import pytest

pytest.importorskip("mitmproxy")

from corral.proxy.flowfile import FlowFile, check
from corral.proxy.responses import BLANKED, RESPONSES_FILE

from .harness import plain_request, read_flows, record_visit


async def test_allowed_answers_are_kept_by_name_with_request_credentials_blanked(recording) -> None:
    proxy, _, state = recording
    await record_visit(proxy, "/page", b"<p>one</p>")
    blocked = plain_request("blocked.test")
    await proxy.requestheaders(blocked)
    await proxy.response(blocked)  # a refusal is not an upstream answer
    proxy.shared.responses.close()
    (flow,) = read_flows(state / RESPONSES_FILE)
    assert (flow.request.host, flow.request.path, flow.response.content) == ("api.allowed.test", "/page", b"<p>one</p>")
    assert flow.request.headers["authorization"] == BLANKED.decode()
    assert flow.request.headers["cookie"] == BLANKED.decode()
    assert flow.request.headers["x-goog-api-key"] == BLANKED.decode()  # every header the audit log redacts
    assert check((state / RESPONSES_FILE).read_bytes()) == FlowFile(1, (state / RESPONSES_FILE).stat().st_size, False)
    assert flow.response.headers["set-cookie"] == "id=1"  # the site's answer is kept as it was
    assert proxy.shared.responses.counts() == {"kept": 1, "skipped": 0, "bytes": len(b"<p>one</p>")}
