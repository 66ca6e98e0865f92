"""A paused session's browser state (cookies, local storage, IndexedDB): exported at its pause through
the browser-profiles seam (:meth:`BrowserProfiles.export_state`) and imported into the resumed
sandbox before its tabs reopen (:meth:`BrowserProfiles.import_state`).

Its bytes are live credentials, so at rest they follow the saved profiles' rule: sealed (AES-GCM)
under the operator's profile key, bound to the session's id, in the paused session's private
directory; with no profile key they are held in the gateway's memory only, like brokered secrets'
values, and a gateway restart loses them (the tabs then come back without their cookies, and the
log says so)."""

from __future__ import annotations

import logging
from pathlib import Path

from corral.errors import ProfileUnreadable
from corral.gateway.profiles import seal, unseal
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.store import private_dir, private_file
from corral.runtime import SandboxAddress

log = logging.getLogger(__name__)

SEALED_NAME = "browser.sealed"
# The sealed bytes' associated data: this tag and the session's id (a blob moved to another paused
# session does not open).
OWNER_TAG = "paused"


class PausedBrowser:
    """:class:`~corral.gateway.sessions.savedstate.BrowserState` through the browser-profiles seam."""

    def __init__(self, profiles: BrowserProfiles, root: Path, max_bytes: int) -> None:
        self._profiles, self._root, self._max_bytes = profiles, root, max_bytes
        self._held: dict[str, bytes] = {}  # session id -> state, without a profile key

    def _path(self, session_id: str) -> Path:
        return self._root / session_id / SEALED_NAME

    async def export(self, session_id: str, sandbox: SandboxAddress) -> int | None:
        """The browser's state out of ``sandbox``, kept until its resume; its size in bytes. Over the
        cap, or refused by the sandbox, it raises (and the pause fails, the session running on)."""
        state = await self._profiles.export_state(sandbox, self._max_bytes)
        store = self._profiles.store
        if store.enabled:
            private_dir(self._path(session_id).parent)
            with private_file(self._path(session_id), None) as out:
                out.write(seal(store.require(), OWNER_TAG, session_id, state))
        else:
            self._held[session_id] = state
        return len(state)

    def state(self, session_id: str) -> bytes | None:
        """What the pause exported (None: nothing, or lost with a restarted gateway's memory)."""
        state = self._held.get(session_id)
        if state is None and self._path(session_id).is_file() and self._profiles.store.enabled:
            sealed = self._path(session_id).read_bytes()
            state = unseal(self._profiles.store.require(), OWNER_TAG, session_id, sealed)
        return state

    async def restore(self, session_id: str, sandbox: SandboxAddress) -> None:
        """Into the resumed ``sandbox``. A state that is gone (a restarted gateway's memory) or does
        not open (the profile key changed, the blob damaged or moved) is as lost: the session resumes
        without it, its tabs logged out, and the log says why; never a session that cannot resume."""
        try:
            state = self.state(session_id)
        except (ProfileUnreadable, OSError) as exc:
            log.warning("session %s resumes without its browser's state: %s", session_id, exc)
            return
        if state is None:
            log.warning("session %s resumes without its browser's state (the gateway restarted meanwhile)", session_id)
            return
        await self._profiles.import_state(sandbox, state, self._max_bytes)

    def discard(self, session_id: str) -> None:
        self._held.pop(session_id, None)
        self._path(session_id).unlink(missing_ok=True)
