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


async def _post(proxy, body: bytes):  # type: ignore[no-untyped-def]
    from .harness import answered, connect_flow, tunnel_request

    connect = connect_flow("api.allowed.test")
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, "api.allowed.test", "/login", method="POST")
    flow.request.content = body
    await proxy.requestheaders(flow)
    await proxy.response(answered(flow, b"<p>welcome</p>"))


async def test_a_persons_post_is_kept_without_its_body_and_the_agents_with_it(recording) -> None:
    proxy, _, state = recording
    proxy.shared.actions.start("h1.beef", "human:lnk_x")  # a person's input in flight (the controller said so)
    await _post(proxy, b"user=ann&password=c0rrect-h0rse")
    proxy.shared.actions.end("h1.beef")
    proxy.shared.actions.start("a2.beef")  # the agent's own
    await _post(proxy, b"q=agent-query")
    proxy.shared.responses.close()
    person, agent = read_flows(state / RESPONSES_FILE)
    assert person.request.content == BLANKED and person.response.content == b"<p>welcome</p>"
    assert agent.request.content == b"q=agent-query"
    assert b"c0rrect-h0rse" not in (state / RESPONSES_FILE).read_bytes()


async def test_a_post_made_while_a_person_holds_the_lease_keeps_no_body_whoever_it_is_charged_to(recording) -> None:
    from corral.proxy import control

    proxy, _, state = recording
    channel = next(addon for addon in proxy.addons if type(addon).__name__ == "ControlChannel")
    channel.handle("controller", control.LeaseEvent(change="taken", holder="human:lnk_x", previous="agent"))
    await _post(proxy, b"password=c0rrect-h0rse")  # charged to no action: still the person's turn
    channel.handle("controller", control.LeaseEvent(change="returned", holder="agent", previous="human:lnk_x"))
    await _post(proxy, b"q=agent-query")
    proxy.shared.responses.close()
    person, agent = read_flows(state / RESPONSES_FILE)
    assert person.request.content == BLANKED and agent.request.content == b"q=agent-query"


async def test_a_post_sent_in_a_persons_turn_keeps_no_body_though_its_answer_comes_after_the_hand_back(
    recording,
) -> None:
    from corral.proxy import control

    from .harness import answered, connect_flow, tunnel_request

    proxy, _, state = recording
    channel = next(addon for addon in proxy.addons if type(addon).__name__ == "ControlChannel")
    connect = connect_flow("api.allowed.test")
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, "api.allowed.test", "/login", method="POST")
    flow.request.content = b"password=c0rrect-h0rse"
    channel.handle("controller", control.LeaseEvent(change="taken", holder="human:lnk_x", previous="agent"))
    await proxy.requestheaders(flow)  # it leaves in the person's turn ...
    channel.handle("controller", control.LeaseEvent(change="returned", holder="agent", previous="human:lnk_x"))
    await proxy.response(answered(flow, b"<p>welcome</p>"))  # ... and its answer comes after the hand-back
    proxy.shared.responses.close()
    (person,) = read_flows(state / RESPONSES_FILE)
    assert person.request.content == BLANKED
    assert b"c0rrect-h0rse" not in (state / RESPONSES_FILE).read_bytes()
