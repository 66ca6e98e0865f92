"""Response recording: every upstream answer the policy let through is kept
(:class:`~corral.proxy.responses.ResponseStore`, ``responses.mitm``) for later hermetic replays."""

from __future__ import annotations

from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from corral.proxy.addons.state import Shared, note_of
from corral.proxy.responses import RESPONSES_FILE, ResponseStore

HUMAN = "human:"  # a person's input (a viewer holding the lease): what it posts is not kept


class ResponseRecorder:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def load(self, loader: Loader) -> None:
        loader.add_option("corral_keep_responses", bool, False, "Keep upstream answers for hermetic replays.")
        loader.add_option("corral_responses_max_body", int, 16 << 20, "Largest request+response kept, in bytes.")
        loader.add_option("corral_responses_max_total", int, 256 << 20, "Bytes of responses kept per session.")

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if not any(name.startswith("corral_") for name in updated) or self.shared.responses is not None:
            return
        if opts.corral_state_dir and opts.corral_keep_responses and not opts.corral_hermetic:
            self.shared.responses = ResponseStore(
                Path(opts.corral_state_dir) / RESPONSES_FILE,
                opts.corral_responses_max_body,
                opts.corral_responses_max_total,
            )

    def response(self, flow: http.HTTPFlow) -> None:
        note = note_of(flow)
        store = self.shared.responses
        if store is None or note is None or note.verdict.refused or flow.is_replay:
            return
        if flow.request.method != "CONNECT":
            # A person's: charged to their input, or made while they hold the lease (whoever it is
            # charged to, a person's form post must not be kept).
            actor = note.attribution.actor or ""
            by_person = actor.startswith(HUMAN) or self.shared.lease_holder.startswith(HUMAN)
            store.offer(flow, note.host, by_person=by_person)

    def done(self) -> None:
        if self.shared.responses is not None:
            self.shared.responses.close()
            self.shared.responses = None
