"""What mitmdump loads (corral.proxy.load): the egress addons over one shared state, each with
hooks mitmproxy knows by those names (a misspelt hook would never be called)."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import hooks
from mitmproxy.proxy import layer, server_hooks  # noqa: F401  (registers their hook names)
from mitmproxy.proxy.layers import http, tls  # noqa: F401

from corral.proxy import load
from corral.proxy.addons import (
    ActionAttribution,
    AuditTrail,
    ControlChannel,
    HermeticPlayback,
    Pinning,
    PolicyGate,
    ResponseRecorder,
    SecretBroker,
)
from corral.proxy.addons.state import Shared

LIFECYCLE = {"load", "configure", "running", "done"}


def test_the_addons_are_composed_in_the_order_their_hooks_must_run() -> None:
    kinds = [type(addon) for addon in load.compose(Shared())]
    assert kinds == [
        HermeticPlayback,
        ActionAttribution,
        PolicyGate,
        SecretBroker,
        Pinning,
        ControlChannel,
        AuditTrail,
        ResponseRecorder,
    ]
    assert [type(addon) for addon in load.addons] == kinds


def test_the_addons_share_one_state() -> None:
    shared = Shared()
    gate, pinning = (a for a in load.compose(shared) if isinstance(a, PolicyGate | Pinning))
    assert gate.live is pinning.live is shared.policy and gate.connections is pinning.connections


@pytest.mark.parametrize("addon", load.addons, ids=lambda a: type(a).__name__)
def test_every_public_method_is_a_mitmproxy_hook(addon: object) -> None:
    methods = {name for name, _ in inspect.getmembers(addon, inspect.ismethod) if not name.startswith("_")}
    extra = {"role", "handle"} if isinstance(addon, ControlChannel) else set()  # the channel's own API
    assert methods - extra <= set(hooks.all_hooks) | LIFECYCLE
