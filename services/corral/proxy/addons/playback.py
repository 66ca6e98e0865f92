"""Hermetic playback: a session that never dials out answers every request the policy let through
from a recording (``$corral_state_dir/replay.mitm``), or refuses it as not recorded.

Nothing is resolved or dialled in such a session (:class:`~corral.proxy.vetting.LivePolicy` and
:mod:`~corral.proxy.addons.pinning` see to that); the sidecar has no route out either. The
matching is mitmproxy's own server replay (:class:`~corral.proxy.responses.Playback`), asked only
after the policy decided.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mitmproxy import ctx, exceptions, http
from mitmproxy import io as flow_io
from mitmproxy.addonmanager import Loader

from corral.proxy.addons.flows import url_of
from corral.proxy.addons.state import Shared, note_of
from corral.proxy.audit import redact_url
from corral.proxy.policy import Decision
from corral.proxy.refusal import NOT_RECORDED, refusal_response
from corral.proxy.responses import REPLAY_FILE, Playback

log = logging.getLogger(__name__)


class HermeticPlayback:
    def __init__(self, shared: Shared) -> None:
        self.live = shared.policy
        self.replay = shared.replay
        self.playback = Playback()  # the recorded answers a hermetic session gives

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "corral_hermetic", bool, False, f"Answer only from $corral_state_dir/{REPLAY_FILE}; never dial out."
        )

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("corral_") for name in updated):
            return
        # First in load.py's order: if a later addon's configure fails, a hermetic proxy still never dials.
        self.live.hermetic = self.live.hermetic or ctx.options.corral_hermetic
        if self.live.hermetic and self.replay.error is not None:
            self.replay.error = self._load()
            if self.replay.error is not None:
                # A warning, not an error or an exception: mitmdump exits on either at startup, and
                # the gateway could not say why. The proxy stays up refusing everything as not
                # recorded, and its status carries the reason.
                log.warning("hermetic replay unavailable: %s", self.replay.error)

    def request(self, flow: http.HTTPFlow) -> None:
        """Every request the policy let through is answered from the recording, or refused."""
        note = note_of(flow)
        if not self.live.hermetic or note is None or flow.response is not None:
            return
        recorded = self.playback.next_flow(flow)
        # A recorded WebSocket upgrade cannot be replayed: there is no server to carry it on.
        if recorded is not None and recorded.response is not None and recorded.response.status_code != 101:
            response = recorded.response.copy()
            if ctx.options.server_replay_refresh:
                response.refresh()  # type: ignore[no-untyped-call,unused-ignore]
            flow.response = response
            flow.is_replay = "response"
            return
        reason = f"{flow.request.method} {redact_url(url_of(flow.request, note.host))} is not in the recording"
        note.refuse(Decision(False, reason, NOT_RECORDED), 502)
        flow.response = refusal_response(502, note.host, note.verdict.decision, flow.request.headers.get("accept", ""))

    def _load(self) -> str | None:
        """The recorded responses loaded; what went wrong, or None."""
        opts = ctx.options
        if opts.connection_strategy != "lazy":
            # Eager would dial the upstream at each CONNECT, which a hermetic session never does.
            return "corral_hermetic needs connection_strategy=lazy"
        if not opts.corral_state_dir:
            return "corral_hermetic needs corral_state_dir"
        try:
            flows = flow_io.read_flows_from_paths([str(Path(opts.corral_state_dir) / REPLAY_FILE)])
        except exceptions.FlowReadException as exc:
            return f"cannot read the recorded responses: {exc}"
        self.replay.flows = self.playback.add_recorded([f for f in flows if isinstance(f, http.HTTPFlow)])
        log.info("hermetic replay from %d recorded responses", self.replay.flows)
        return None
