"""Corral's egress addons for mitmproxy, one concern each, as mitmproxy's own addons are.

- :class:`HermeticPlayback`: a hermetic session's answers, from a recording;
- :class:`ActionAttribution`: the action each flow is charged to (a command's own, or the
  controller's in flight), proxy credentials taken off;
- :class:`PolicyGate`: the policy's decision on every CONNECT and request;
- :class:`SecretBroker`: brokered secrets' values put in for bound requests, taken out of answers;
- :class:`Pinning`: upstream connections dialled to the vetted address only;
- :class:`ControlChannel`: the gateway's policy and status, the controller's actions;
- :class:`AuditTrail`: the hash-chained audit record of everything the others did;
- :class:`ResponseRecorder`: upstream answers kept for hermetic replays.

They share one :class:`Shared` object; :mod:`corral.proxy.load` composes them in that order.
Loaded by the sidecar's master (corral.proxy.leanmaster, mitmproxy 12 on Python 3.13); they also run on
mitmproxy 11.0 (Python 3.11), where the unit tests use them.
"""

from corral.proxy.addons.attribution import ActionAttribution
from corral.proxy.addons.broker import SecretBroker
from corral.proxy.addons.channel import ControlChannel
from corral.proxy.addons.gate import PolicyGate
from corral.proxy.addons.pinning import Pinning
from corral.proxy.addons.playback import HermeticPlayback
from corral.proxy.addons.recorder import ResponseRecorder
from corral.proxy.addons.state import Shared
from corral.proxy.addons.trail import AuditTrail

__all__ = [
    "ActionAttribution",
    "AuditTrail",
    "ControlChannel",
    "HermeticPlayback",
    "Pinning",
    "PolicyGate",
    "ResponseRecorder",
    "SecretBroker",
    "Shared",
]
