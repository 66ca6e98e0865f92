"""Reading the action a command names in Proxy-Authorization (corral.proxy.attribution), and what
a record says of an attribution."""

from __future__ import annotations

import base64

import pytest

from corral.contracts.actors import is_human
from corral.contracts.control import PROXY_USER
from corral.proxy.attribution import Attribution, command_action, unvouched
from corral.sandbox.agent.agentenv import command_environment


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


@pytest.mark.parametrize("action", ["a1.x", "a12.0f9e", "act:with:colons", "x" * 64])
def test_the_action_named_by_corral_action(action: str) -> None:
    assert command_action(basic(f"corral-action:{action}")) == action
    assert command_action("  basic  " + basic(f"corral-action:{action}").split()[1] + " ") == action


def test_the_proxy_user_is_the_one_commands_are_given() -> None:
    url = command_environment("corral-proxy:8080", None, "a1.x")["HTTP_PROXY"]
    assert url.startswith(f"http://{PROXY_USER}:")


def test_an_id_still_percent_encoded_is_decoded_once() -> None:
    assert command_action(basic("corral-action:a1%2Eboot%3A2")) == "a1.boot:2"


@pytest.mark.parametrize(
    "value",
    [
        basic("someone:a1.x"),  # another user: somebody else's proxy credentials
        basic("corral-action"),  # no password
        basic("corral-action:"),  # an empty id
        basic("corral-action:" + "x" * 65),
        basic("corral-action:a1 x"),
        basic("corral-action:a1\nx"),
        basic("corral-action:a1%0Ax"),  # a newline, encoded
        basic("corral-action:a%2"),  # not an escape
        "Bearer " + base64.b64encode(b"corral-action:a1.x").decode(),
        "Basic not*base64",
        "Basic " + base64.b64encode(b"corral-action:\xff").decode(),
        "Basic",
        "",
    ],
)
def test_anything_else_names_no_action(value: str) -> None:
    assert command_action(value) is None


def test_a_record_says_command_only_when_a_command_named_the_action() -> None:
    assert Attribution.command("a1.x").record() == {"action": "a1.x", "action_source": "command"}
    # The controller's: as every record said before commands could name an action.
    assert Attribution.controller("a2.x").record() == {"action": "a2.x"}
    assert Attribution.controller(None) == Attribution(None, None)
    assert Attribution.controller(None).record() == {"action": None}


def test_a_record_names_the_actor_of_a_human_or_cdp_action_only() -> None:
    assert Attribution.controller("h1.boot", "human:lnk_3kq9x0a1b2c4").record() == {
        "action": "h1.boot",
        "actor": "human:lnk_3kq9x0a1b2c4",
    }
    assert Attribution.controller("a1.boot").record() == {"action": "a1.boot"}  # the agent's: as before
    assert Attribution.controller(None, "cdp:cdp_0a1b2c3d").record() == {"action": None}  # no action, no actor


HUMAN = "human:lnk_3kq9x0a1b2c4"


def test_a_flow_without_credentials_is_never_charged_to_a_human() -> None:
    # The agent's action and then a human's in flight: the agent's (the latest that is not a human's).
    assert unvouched([("a1.x", None), ("h1.x", HUMAN)]) == Attribution.controller("a1.x")
    # A human's alone: to none, not to the person.
    assert unvouched([("h1.x", HUMAN)]).record() == {"action": None}
    assert unvouched([("h1.x", HUMAN), ("h2.x", "human:lnk_other")]).record() == {"action": None}
    # A CDP connection's is the agent's own: it keeps its actor.
    cdp = unvouched([("h1.x", HUMAN), ("c1.x", "cdp:cdp_0a1b")])
    assert cdp.record() == {"action": "c1.x", "actor": "cdp:cdp_0a1b"}
    assert unvouched([]) == Attribution(None, None)


@pytest.mark.parametrize("actor", [None, "cdp:cdp_1", "agent", "humans:x", "api-key:k1"])
def test_only_a_human_prefix_is_a_human(actor: str | None) -> None:
    assert not is_human(actor)
    assert is_human("human:lnk_1")
