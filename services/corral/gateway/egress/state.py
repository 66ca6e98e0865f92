"""The egress pairs' state on the host, under ``<data_dir>/egress/``: each session's state directory
(bind-mounted into its proxy: CA, policy, audit log), the sandbox's secrets beside it, the gateway's
markers of grounds no session took, and the key each proxy's token is derived from."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
from pathlib import Path

from corral.errors import ReplayNotFound, SandboxError
from corral.gateway.anchors import AnchorBook
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import copy_private, private_dir, session_dir, write_json, write_private
from corral.proxy import audit, ca
from corral.proxy.control import AUDIT_FILE, POLICY_FILE, REPLAY_FILE, RESPONSES_FILE

from .pairs import GROUNDS_DIR, META_FILE, PROXY_TOKEN_FILE, TOKEN_KEY_FILE

log = logging.getLogger(__name__)


class ProxyTokens:
    """The token the gateway shows each session's proxy, derived from one key kept in the data dir."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._key: bytes | None = None

    def key(self) -> bytes:
        """The token key, made once (0600 from its creation) and kept in the data dir."""
        if self._key is None:
            path = private_dir(self._data_dir) / TOKEN_KEY_FILE
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                key = path.read_bytes()
            else:
                key = secrets.token_bytes(32)
                with os.fdopen(fd, "wb") as out:
                    out.write(key)
            if len(key) < 32:
                raise SandboxError(f"{path} is not a token key (delete it to make a new one)")
            self._key = key
        return self._key

    def token(self, session_id: str) -> str:
        """HMAC(key, session id): nothing on disk but the key (0600) gives it, and a restarted
        gateway derives it again."""
        digest = hmac.new(self.key(), f"corral-proxy-gateway-token:{session_id}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")


class EgressState:
    """Each session's egress state on disk, and the grounds' markers."""

    def __init__(self, settings: GatewaySettings, anchors: AnchorBook) -> None:
        self._settings = settings
        self._anchors = anchors
        self.root = settings.data_dir / "egress"

    def state_dir(self, session_id: str) -> Path:
        return session_dir(self.root, session_id)

    def responses_path(self, session_id: str) -> Path:
        return self.state_dir(session_id) / RESPONSES_FILE

    def sandbox_secrets_dir(self, session_id: str) -> Path:
        """Beside the proxy's state directory, never inside it: the proxy must not write what the
        sandbox reads."""
        state = self.state_dir(session_id)
        return state.with_name(state.name + ".sandbox")

    def write_sandbox_token(self, session_id: str, token: str) -> Path:
        # 0600: the runtime hands it to the sandbox's controller uid as it mounts it; the agent's cannot read it.
        path = private_dir(self.sandbox_secrets_dir(session_id)) / PROXY_TOKEN_FILE
        write_private(path, token)
        return path

    def ground_state(self, session_id: str) -> tuple[Path, ca.SessionCA]:
        """The state directory with its CA (and the upstream CA to trust); returns it and the CA."""
        state = self.state_dir(session_id)
        # The marker first: a gateway killed between the two leaves a marker (its next start removes
        # the state, if any), never an unmarked state.
        write_private(self.ground_marker(session_id), self._settings.instance)
        private_dir(state)
        # 0700 and 0600 throughout: the runtime hands the directory to the proxy's uid as it mounts it.
        private_dir(state / "ca")
        authority = ca.create(state / "ca", session_id)
        upstream = self._settings.egress_upstream_ca
        if upstream is not None:
            copy_private(upstream, state / "upstream-ca.pem")
        return state, authority

    def claim_ground(self, state: Path, allow: list[str], mode: str, replay: Path | None) -> None:
        """A ground's state made a session's: the policy its proxy starts with, a hermetic one's replay."""
        write_json(state / POLICY_FILE, {"allow": allow, "mode": mode, "generation": 0})
        if replay is not None:
            try:
                copy_private(replay, state / REPLAY_FILE)  # a copy: the upload may be deleted or reused
            except FileNotFoundError:
                raise ReplayNotFound("the recorded responses were deleted meanwhile") from None

    def ground_marker(self, session_id: str) -> Path:
        """Where the gateway marks a ground no session took yet (0700 dir, 0600 file; see GROUNDS_DIR)."""
        return session_dir(private_dir(self.root / GROUNDS_DIR), session_id)

    def unclaimed_grounds(self) -> list[str]:
        """The session ids of this instance's grounds no session took (by the gateway's markers: the
        one record of it, as a network made ahead carries no kind)."""
        mine = []
        for marker in sorted((self.root / GROUNDS_DIR).glob("ses_*")):
            with contextlib.suppress(OSError):
                if marker.read_text().strip() == self._settings.instance:
                    mine.append(marker.name)
        return mine

    def remove_unclaimed_grounds(self) -> list[str]:
        """This instance's grounds a gateway made and never gave a session (it was killed while it held
        them): their state goes (their networks go with the orphan networks). Returns their session ids.

        Only a marker in the gateway's own .grounds directory counts; and a state directory that holds a
        session's traces (see :meth:`holds_a_session`) is kept whatever its marker says."""
        removed = []
        for marker in (self.root / GROUNDS_DIR).glob("ses_*"):
            try:
                if marker.read_text().strip() != self._settings.instance:
                    continue
                state = self.state_dir(marker.name)
            except (OSError, ValueError):
                continue
            if self.holds_a_session(marker.name):
                log.error("%s is marked as a ground no session took, but holds a session's state: kept", state)
            else:
                shutil.rmtree(state, ignore_errors=True)
                shutil.rmtree(self.sandbox_secrets_dir(marker.name), ignore_errors=True)
                removed.append(marker.name)
            marker.unlink(missing_ok=True)
        return removed

    def holds_a_session(self, session_id: str) -> bool:
        """Whether the session's state was ever a session's: the gateway anchored its chain (outside any
        proxy's reach), or it holds a policy, session metadata, or audit records beyond a proxy's start."""
        state = self.state_dir(session_id)
        if self._anchors.path(session_id).exists() or (state / POLICY_FILE).exists() or (state / META_FILE).exists():
            return True
        try:
            with (state / AUDIT_FILE).open("rb") as log_file:
                # Bounded lines: a line longer than any record is not the proxy's start either.
                return any(
                    _event_of(line) != "proxy" for line in audit.bounded_lines(log_file, lenient=True) if line.strip()
                )
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell: keep it

    def erase(self, session_id: str) -> None:
        """Everything on disk of a session that never was one: its state, the sandbox's secrets, its
        ground marker (its anchors are the ledger's)."""
        shutil.rmtree(self.state_dir(session_id), ignore_errors=True)
        shutil.rmtree(self.sandbox_secrets_dir(session_id), ignore_errors=True)
        self.ground_marker(session_id).unlink(missing_ok=True)

    def end(self, session_id: str) -> None:
        """What goes when a session ends; its state (the audit log) stays."""
        # A hermetic session's copy of the recording it answered from: the bundle and the upload hold it.
        (self.state_dir(session_id) / REPLAY_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.sandbox_secrets_dir(session_id), ignore_errors=True)


def _event_of(line: bytes) -> str:
    """The event of one audit line; "" for a line that is no record (a torn write, garbage)."""
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    return str(record.get("event", "")) if isinstance(record, dict) else ""
