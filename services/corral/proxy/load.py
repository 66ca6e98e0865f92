"""What ``mitmdump -s`` loads: Corral's egress addons, composed.

The order is the order mitmproxy calls each hook in: playback's configure first (a hermetic
session is marked before anything else can fail), the flow's action (and the proxy credentials
that name it taken off) before anything reads the request, the policy's decision before pinning and
playback act on it, brokered secrets put in after that decision and taken back out before anything
records the flow, the control channel's server up before the proxy's first record, and the
audit record after everything it records. mitmproxy runs this file as an anonymous module (not in
``sys.modules``), which breaks dataclasses under postponed annotations; so the addons live in the
importable :mod:`corral.proxy.addons` and this file only composes them.
"""

from corral.proxy.addons import (
    ActionAttribution,
    AuditTrail,
    ControlChannel,
    HermeticPlayback,
    Pinning,
    PolicyGate,
    ResponseRecorder,
    SecretBroker,
    Shared,
)


def compose(shared: Shared) -> list[object]:
    """The egress addons over one shared state, in the order mitmproxy calls them."""
    return [
        HermeticPlayback(shared),
        ActionAttribution(shared),
        PolicyGate(shared),
        SecretBroker(shared),
        Pinning(shared),
        ControlChannel(shared),
        AuditTrail(shared),
        ResponseRecorder(shared),
    ]


addons = compose(Shared())
