"""Response recording: every upstream answer the policy let through is kept
(:class:`~corral.proxy.responses.ResponseStore`, ``responses.mitm``) for later hermetic replays."""

from __future__ import annotations

from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from corral.contracts.actors import is_human
from corral.proxy.addons.state import Shared, note_of
from corral.proxy.responses import RESPONSES_FILE, ResponseStore

_BY_PERSON = "corral_by_person"  # flow metadata: whether a person's turn was on as the request left


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

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        # Decided as the request leaves, not when its answer comes (the lease may be back by then): a
        # request is a person's while they hold the lease or an input of theirs is in flight, whoever
        # it is charged to (Chromium's requests carry no proxy credentials, so they are charged to the
        # agent's action in flight or to none: corral.proxy.attribution.unvouched).
        if self.shared.responses is not None:
            flow.metadata[_BY_PERSON] = self._persons_turn()

    def _persons_turn(self) -> bool:
        return is_human(self.shared.lease_holder) or any(
            is_human(actor) for _, actor in self.shared.actions.in_flight()
        )

    def response(self, flow: http.HTTPFlow) -> None:
        note = note_of(flow)
        store = self.shared.responses
        if store is None or note is None or note.verdict.refused or flow.is_replay:
            return
        if flow.request.method != "CONNECT":
            # A person's form post must not be kept: what the request was when it left (judged now for a
            # flow that never passed the hook), or charged to a person's input.
            left_in_turn = flow.metadata.get(_BY_PERSON)
            by_person = (self._persons_turn() if left_in_turn is None else bool(left_in_turn)) or is_human(
                note.attribution.actor
            )
            store.offer(flow, note.host, by_person=by_person)

    def done(self) -> None:
        if self.shared.responses is not None:
            self.shared.responses.close()
            self.shared.responses = None
