"""Each session's egress: its own internal network, its mitmproxy sidecar, its CA, its audit log.

The proxy is the single writer of the session's audit log (policy changes included, so the chain
stays one line); the gateway only reads it. State lives on the host under
``<data_dir>/egress/<session>/`` (bind-mounted into the proxy), so logs outlive sessions and a
restarted proxy continues the same chain with the same CA and policy.

The gateway never takes the proxy's word for its own state: every answer carries the policy's
generation and the chain's head. The watchdog compares the policy with the one the gateway last
set (a generation or policy it did not set means someone else changed it: logged as an error, and
the gateway's policy is set again), and each new head is anchored in the gateway's
:class:`~corral.gateway.anchors.AnchorBook`, outside the proxy's reach, during the session and at
its end.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.contracts import auth as sandbox_auth
from corral.errors import ControlError, EgressUnavailable, ReplayNotFound, ReplayUnreadable, SandboxError
from corral.gateway.anchors import AnchorBook
from corral.gateway.secrets import SecretSet, SecretVault
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import copy_private, private_dir, session_dir, write_json, write_private
from corral.proxy import audit, ca, control
from corral.proxy.control import AUDIT_FILE, POLICY_FILE, REPLAY_FILE, RESPONSES_FILE
from corral.proxy.policy import parse_rule
from corral.runtime import SESSION_LABEL, ProxySpec, SandboxRuntime, SessionNetwork, State, hostguard

log = logging.getLogger(__name__)

META_FILE = "session.json"
# <egress root>/.grounds/<session>: a ground's marker until a session takes it, holding the instance's
# name. Kept by the gateway alone, never in the ground's state directory: that one is mounted into the
# session's proxy, which could forge a marker there and have a restarted gateway delete a live
# session's audit log. Nothing mounts .grounds (the runtime mounts a proxy's state dir and the
# sandbox's <session>.sandbox dir only), and "ses_*" globs over the root never see it.
GROUNDS_DIR = ".grounds"
# A proxy started ahead starts here: enforce, nothing allowed, until its session's policy is set.
STRICTEST_MODE = "enforce"
PROXY_TOKEN_FILE = "proxy-token"  # in <session>.sandbox: the sandbox's copy of the controller token
# A ground held longer than this is dropped and made again rather than taken (its CA ages meanwhile).
GROUND_MAX_AGE_S = 24 * 3600.0
# A ground's CA must outlast the longest session by this much, beyond max_timeout_s.
GROUND_CA_MARGIN_S = 3600.0
# The key each session's proxy token is derived from (HMAC of the session id), so no record on disk
# holds a token: <data_dir>/egress-token.key, 0600 in the 0700 data dir.
TOKEN_KEY_FILE = "egress-token.key"
PROXY_MEMORY_MB = 512
REASSERT_ACTOR = "gateway:reassert"  # the actor of a policy the gateway sets again after a foreign change
POLL_TIMEOUT_S = 2.0
# A proxy in one of these (or gone) while the gateway waits for it to come up never will.
PROXY_FAILED_STATES: frozenset[State | None] = frozenset({"exited", "dead", "restarting", None})
# A proxy in one of these is left alone by the watchdog (up, or on its way up or out).
PROXY_BUSY_STATES: frozenset[State] = frozenset({"running", "restarting", "created", "removing"})


@dataclass(frozen=True, slots=True)
class Egress:
    """One session's egress pair, as kept in the session record (corral.gateway.sessions.SessionRecord
    serialises it): nothing secret in it, as the proxy's token is derived, never stored."""

    session_id: str
    network: str
    subnet: str
    gateway: str
    proxy_id: str
    proxy_name: str
    proxy_address: str
    state_dir: str

    @property
    def audit_path(self) -> Path:
        return Path(self.state_dir) / AUDIT_FILE


@dataclass(frozen=True, slots=True)
class PolicyView:
    """A proxy's policy as the control channel reports it (or as the gateway last set it)."""

    generation: int
    allow: tuple[str, ...]
    mode: str

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> PolicyView:
        return cls(int(reply.get("generation", 0)), tuple(reply.get("allow") or ()), str(reply.get("mode")))

    def record(self) -> audit.AnchoredPolicy:
        return {"generation": self.generation, "allow": list(self.allow), "mode": self.mode}


def canonical_allow(allow: list[str]) -> tuple[str, ...]:
    """The allowlist as the proxy reports it back (each entry in its canonical text)."""
    try:
        return tuple(str(parse_rule(entry)) for entry in allow)
    except ValueError:
        return tuple(allow)  # the proxy refuses it anyway; nothing to compare against


@dataclass(frozen=True, slots=True)
class Ground:
    """What a session's egress needs before its proxy can start and that no request decides: its
    network and its CA in its state directory (corral.gateway.grounds keeps a few made ahead)."""

    session_id: str
    network: SessionNetwork
    state_dir: Path
    ca_cert: str  # the CA's certificate (PEM), which the sandbox trusts; its key stays in state_dir
    made_at: float = 0.0  # time.time() when it was made
    ca_not_after: float = float("inf")  # when its CA expires
    # Its proxy, started ahead (CORRAL_GROUND_PROXIES) in enforce mode with nothing allowed, until a
    # session takes it and sets its policy; None when the proxy starts at the claim.
    egress: Egress | None = None
    # The proxy's controller token (in the proxy's environment and the sandbox's 0600 file; never logged).
    controller_token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A session's network, state and CA, before its proxy starts (the sandbox can start meanwhile)."""

    session_id: str
    network: SessionNetwork
    state_dir: Path
    labels: dict[str, str]
    environment: dict[str, str]  # the proxy's (its token included: in the container, not on disk here)
    sandbox_env: dict[str, str]  # what the sandbox needs beside the proxy's place: its control port, the CA
    hermetic: bool
    # host path -> path in the sandbox, mounted read-only: the control channel's token, a file only the
    # sandbox's controller uid reads (an environment variable would reach every process's exec).
    sandbox_files: dict[str, str] = field(default_factory=dict)
    # Its proxy when the ground's was started ahead: running with nothing allowed, the session's policy
    # still to be set (EgressManager.set_start_policy) before the session's token is returned.
    egress: Egress | None = None


class EgressManager:
    """Makes, watches and tears down egress pairs; the only place that talks to proxies."""

    def __init__(self, settings: GatewaySettings, runtime: SandboxRuntime) -> None:
        self._settings = settings
        self._runtime = runtime
        self.root = settings.data_dir / "egress"
        self._token_key: bytes | None = None
        self.anchors = AnchorBook(settings.data_dir)  # outside self.root: no proxy ever mounts it
        self.control_port = control.CONTROL_PORT
        self._expected: dict[str, PolicyView] = {}  # the policy the gateway last set, per session
        self._locks: dict[str, asyncio.Lock] = {}  # one policy conversation per proxy at a time
        self.vault = SecretVault()  # each session's secrets, as the gateway last set them on its proxy

    async def start(self) -> bool:
        """The egress network, the archive and the token key; returns whether the host guard holds
        on the egress network."""
        guarded = await asyncio.to_thread(self._runtime.ensure_egress_network, self._settings.egress_network)
        private_dir(self.root)
        self._key()
        unclaimed = await asyncio.to_thread(self.remove_unclaimed_grounds)
        if unclaimed:
            log.info("removed the state of %d session grounds made ahead and never taken", len(unclaimed))
        return guarded

    def _key(self) -> bytes:
        """The token key, made once (0600 from its creation) and kept in the data dir."""
        if self._token_key is None:
            path = private_dir(self._settings.data_dir) / TOKEN_KEY_FILE
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
            self._token_key = key
        return self._token_key

    def token(self, session_id: str) -> str:
        """The token the gateway shows the session's proxy: HMAC(key, session id), so nothing on disk
        but the key (0600) gives it, and a restarted gateway derives it again."""
        digest = hmac.new(self._key(), f"corral-proxy-gateway-token:{session_id}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    # -- lifecycle ------------------------------------------------------------------------------------

    def state_dir(self, session_id: str) -> Path:
        return session_dir(self.root, session_id)

    def responses_path(self, session_id: str) -> Path:
        return self.state_dir(session_id) / RESPONSES_FILE

    def make_ground_blocking(self, session_id: str, labels: dict[str, str], proxy: bool = False) -> Ground:
        """A session's network (guarded by the runtime), state directory and CA, before anyone asks for
        it (blocking: run it in a thread); with ``proxy``, its proxy started too, in enforce mode with
        nothing allowed (no policy file: an empty allowlist), and the sandbox's copy of its controller
        token written. Marked unclaimed until :meth:`prepare_blocking` takes it."""
        made_at = time.time()
        network = self._runtime.create_session_network(session_id, labels, self._settings.session_subnets)
        try:
            state, authority = self._ground_state(session_id)
            ground = Ground(session_id, network, state, authority.cert_pem, made_at, authority.not_after)
            if not proxy:
                return ground
            token = secrets.token_urlsafe(24)
            self._write_sandbox_token(session_id, token)
            prepared = Prepared(
                session_id,
                network,
                state,
                labels,
                self._proxy_environment(session_id, token, STRICTEST_MODE),
                {},
                False,
            )
            return dataclasses.replace(ground, egress=self.start_proxy_blocking(prepared), controller_token=token)
        except BaseException:
            self._runtime.remove_egress(session_id)  # the proxy if it started, and the network
            self.forget_blocking(session_id)
            raise

    def ground_fresh(self, ground: Ground, now: float | None = None) -> bool:
        """Whether a ground held in the pool may still be taken: younger than GROUND_MAX_AGE_S, and
        its CA valid past the longest session (max_timeout_s) and a margin, so no session's CA expires
        under it."""
        now = time.time() if now is None else now
        outlasts = ground.ca_not_after - now > self._settings.max_timeout_s + GROUND_CA_MARGIN_S
        return now - ground.made_at < GROUND_MAX_AGE_S and outlasts

    def _ground_state(self, session_id: str) -> tuple[Path, ca.SessionCA]:
        """The state directory with its CA (and the upstream CA to trust); returns it and the CA's certificate."""
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

    def drop_ground_blocking(self, ground: Ground) -> None:
        """Undo :meth:`make_ground_blocking` for a ground no session took: nothing of it is kept."""
        if ground.egress is not None:
            self._runtime.remove_egress(ground.session_id)  # its proxy, then its network
        else:
            self._drop_network(ground.network)
        self.forget_blocking(ground.session_id)

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
        if self.anchors.path(session_id).exists() or (state / POLICY_FILE).exists() or (state / META_FILE).exists():
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

    def _claim_ground(self, state: Path, allow: list[str], mode: str, replay: Path | None) -> None:
        """A ground's state made a session's: the policy its proxy starts with, a hermetic one's replay."""
        write_json(state / POLICY_FILE, {"allow": allow, "mode": mode, "generation": 0})
        if replay is not None:
            try:
                copy_private(replay, state / REPLAY_FILE)  # a copy: the upload may be deleted or reused
            except FileNotFoundError:
                raise ReplayNotFound("the recorded responses were deleted meanwhile") from None

    def prepare_blocking(
        self,
        session_id: str,
        allow: list[str],
        mode: str,
        labels: dict[str, str],
        replay: Path | None = None,
        ground: Ground | None = None,
    ) -> Prepared:
        """Network (guarded by the runtime), state and CA, from ``ground`` when one was made ahead for
        ``session_id`` (blocking: run it in a thread); ``replay`` makes it hermetic."""
        if ground is None:
            ground = self.make_ground_blocking(session_id, labels)
        elif ground.session_id != session_id:
            raise ValueError(f"the ground of {ground.session_id} is not {session_id}'s")
        network, state = ground.network, ground.state_dir
        sandbox_env = {
            "CORRAL_PROXY_CONTROL_PORT": str(control.CONTROL_PORT),
            "CORRAL_CA_CERT": ground.ca_cert,
        }
        token_file = self.sandbox_secrets_dir(session_id) / PROXY_TOKEN_FILE
        files = {str(token_file): str(sandbox_auth.PROXY_TOKEN_FILE)}
        try:
            if ground.egress is not None and replay is None:
                # Its proxy runs already, in the strictest state; the session's policy is set on it
                # (set_start_policy) while the sandbox starts, before the session's token is returned.
                self.record_start(session_id, [], STRICTEST_MODE)
                self.ground_marker(session_id).unlink(missing_ok=True)  # last: the state is a session's
                return Prepared(session_id, network, state, labels, {}, sandbox_env, False, files, ground.egress)
            if ground.egress is not None:
                # A hermetic session's proxy starts differently (no way out, answers from the replay):
                # the one started ahead goes, with the chain it began, and this one starts afresh.
                self._runtime.remove(ground.egress.proxy_id)
                (state / AUDIT_FILE).unlink(missing_ok=True)
            self._claim_ground(state, allow, mode, replay)
            self.record_start(session_id, allow, mode)
            controller_token = secrets.token_urlsafe(24)
            self._write_sandbox_token(session_id, controller_token)
            # Last: from here the state is a session's, and a restarted gateway keeps it.
            self.ground_marker(session_id).unlink(missing_ok=True)
        except BaseException:
            self._runtime.remove_egress(session_id)  # a proxy started ahead (by name), and the network
            self.forget_blocking(session_id)
            raise
        environment = self._proxy_environment(session_id, controller_token, mode, hermetic=replay is not None)
        return Prepared(session_id, network, state, labels, environment, sandbox_env, replay is not None, files)

    def _proxy_environment(
        self, session_id: str, controller_token: str, mode: str, hermetic: bool = False
    ) -> dict[str, str]:
        """The proxy's environment (its tokens included: in the container, never on disk here)."""
        s = self._settings
        return {
            "CORRAL_SESSION": session_id,
            "CORRAL_GATEWAY_TOKEN": self.token(session_id),
            "CORRAL_CONTROLLER_TOKEN": controller_token,
            "CORRAL_EGRESS_MODE": mode,
            "CORRAL_TRUSTED_NETWORKS": s.egress_trusted_networks,
            # Never dialled, whatever the trusted networks hold: the host's services stay closed to a
            # report-mode session (the host guard drops the packets too, where it could be installed).
            "CORRAL_HOST_ADDRESSES": ",".join(hostguard.local_addresses()),
            "CORRAL_ALLOW_PRIVATE": "1" if s.egress_allow_private else "0",
            "CORRAL_RECORD_RESPONSES": "1" if s.record_responses else "0",
            "CORRAL_RESPONSES_MAX_BODY": str(s.responses_max_body_mb << 20),
            "CORRAL_RESPONSES_MAX_TOTAL": str(s.responses_max_total_mb << 20),
            "CORRAL_HERMETIC": "1" if hermetic else "0",
            "CORRAL_AUDIT_MAX_BYTES": str(s.audit_max_bytes),
        }

    async def set_start_policy(self, egress: Egress, allow: list[str], mode: str, actor: str, timeout_s: float) -> None:
        """The session's policy on a proxy started ahead (with nothing allowed): once it answers, set
        and acknowledged, with the generation after the start's (any other change is said loudly)."""
        await self.wait_ready(egress, timeout_s)
        await self.set_policy(egress, allow, mode, actor)

    def sandbox_secrets_dir(self, session_id: str) -> Path:
        """Beside the proxy's state directory, never inside it: the proxy must not write what the
        sandbox reads."""
        state = self.state_dir(session_id)
        return state.with_name(state.name + ".sandbox")

    def _write_sandbox_token(self, session_id: str, token: str) -> Path:
        # 0600: the runtime hands it to the sandbox's controller uid as it mounts it; the agent's cannot read it.
        path = private_dir(self.sandbox_secrets_dir(session_id)) / PROXY_TOKEN_FILE
        write_private(path, token)
        return path

    def start_proxy_blocking(self, prepared: Prepared) -> Egress:
        """The session's proxy (blocking); a hermetic one joins no egress network: it has no way out."""
        s = self._settings
        network = prepared.network
        proxy = self._runtime.start_proxy(
            ProxySpec(
                session_id=prepared.session_id,
                network=network,
                state_dir=prepared.state_dir,
                egress_network=None if prepared.hermetic else s.egress_network,
                image=s.egress_image,
                labels=prepared.labels,
                environment=prepared.environment,
                memory=f"{self._proxy_memory_mb(prepared)}m",
            )
        )
        return Egress(
            session_id=prepared.session_id,
            network=network.name,
            subnet=network.subnet,
            gateway=network.gateway,
            proxy_id=proxy.id,
            proxy_name=proxy.name,
            proxy_address=proxy.address,
            state_dir=str(prepared.state_dir),
        )

    @staticmethod
    def _proxy_memory_mb(prepared: Prepared) -> int:
        """A hermetic proxy holds every recorded flow in memory: room for them, beside the usual."""
        if not prepared.hermetic:
            return PROXY_MEMORY_MB
        replay = prepared.state_dir / REPLAY_FILE
        size_mb = replay.stat().st_size >> 20 if replay.exists() else 0
        return PROXY_MEMORY_MB + 3 * size_mb

    async def check_replay(self, egress: Egress) -> int:
        """A hermetic proxy's recorded responses are loaded; returns how many (ReplayUnreadable if not)."""
        replay = (await self.status(egress)).get("replay") or {}
        if replay.get("error"):
            raise ReplayUnreadable(str(replay["error"]))
        return int(replay.get("flows", 0))

    def discard_blocking(self, prepared: Prepared) -> None:
        """Undo :meth:`prepare_blocking` (and a proxy it may have started) for a start that failed:
        no session came of it, so nothing of it is kept."""
        self._runtime.remove_egress(prepared.session_id)
        self.forget_blocking(prepared.session_id)

    def forget_blocking(self, session_id: str) -> None:
        """Everything on disk of a session that never was one (its start failed before its token was
        returned, so nobody can ask for its log): its state, the sandbox's secrets, its ground marker,
        its anchors and what the gateway holds of it. Its proxy and network must be gone already."""
        shutil.rmtree(self.state_dir(session_id), ignore_errors=True)
        shutil.rmtree(self.sandbox_secrets_dir(session_id), ignore_errors=True)
        self.ground_marker(session_id).unlink(missing_ok=True)
        self._remove_anchors(session_id)
        self._expected.pop(session_id, None)
        self._locks.pop(session_id, None)
        self.vault.forget(session_id)
        self.anchors.forget(session_id)

    def _drop_network(self, network: SessionNetwork) -> None:
        self._runtime.remove_session_network(network)

    def teardown_blocking(self, egress: Egress) -> None:
        """Remove the proxy and the network; the state (audit log) stays."""
        self._anchor_end(egress)
        # Drained: the proxy's shutdown writes out the responses still queued for the file.
        self._runtime.remove_egress(egress.session_id, drain=True)
        # A hermetic session's copy of the recording it answered from: the bundle and the upload hold it.
        (self.state_dir(egress.session_id) / REPLAY_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.sandbox_secrets_dir(egress.session_id), ignore_errors=True)
        self._expected.pop(egress.session_id, None)
        self._locks.pop(egress.session_id, None)
        self.vault.forget(egress.session_id)
        self.anchors.forget(egress.session_id)

    def _anchor_end(self, egress: Egress) -> None:
        """The chain's head at the session's end, from the proxy's memory (not its file, which a
        process with the proxy's uid could have changed), before the proxy goes."""
        try:
            reply = control.call_blocking(
                egress.proxy_address,
                self.control_port,
                self.token(egress.session_id),
                {"op": "status"},
                POLL_TIMEOUT_S,
            )
            self._observe(egress.session_id, reply, "end")
        except (ControlError, ValueError, KeyError, TypeError) as exc:
            # A dead proxy: its last anchor stands; verify says how many records come after it.
            log.warning("no final audit anchor for %s: %s", egress.session_id, exc)

    async def wait_ready(self, egress: Egress, timeout_s: float) -> None:
        started = time.monotonic()
        checked = started
        while True:
            try:
                await self.status(egress, timeout_s=1.0)
                return
            except EgressUnavailable:
                now = time.monotonic()
                failed = now - started > timeout_s
                if not failed and now - checked > 1.0:
                    checked = now
                    states = await asyncio.to_thread(self._runtime.proxy_states, {SESSION_LABEL: egress.session_id})
                    failed = states.get(egress.session_id) in PROXY_FAILED_STATES
                if failed:
                    logs = await asyncio.to_thread(self._runtime.proxy_logs, egress.session_id, 20)
                    raise EgressUnavailable(f"egress proxy {egress.proxy_name} did not come up:\n{logs}") from None
                await asyncio.sleep(0.05)

    # -- control --------------------------------------------------------------------------------------

    async def _call(self, egress: Egress, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
        try:
            return await control.call(
                egress.proxy_address, self.control_port, self.token(egress.session_id), message, timeout_s
            )
        except ControlError as exc:
            raise EgressUnavailable(str(exc)) from None

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def status(self, egress: Egress, timeout_s: float = 5.0) -> dict[str, Any]:
        """The proxy's status; its chain head is anchored when it moved."""
        reply = await self._call(egress, {"op": "status"}, timeout_s)
        self._observe(egress.session_id, reply, "poll")
        return reply

    async def report(self, egress: Egress, message: dict[str, Any]) -> None:
        """One of the gateway's own events (op ``link``: a viewer link made, used, revoked, expired)
        into the session's audit chain; raises EgressUnavailable when the proxy did not take it."""
        reply = await self._call(egress, message)
        self._observe(egress.session_id, reply, "poll")

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> dict[str, Any]:
        """Swap the live policy; the proxy logs the change in the session's chain."""
        async with self._lock(egress.session_id):
            return await self._set_policy(egress, allow, mode, actor, "policy")

    async def set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> dict[str, Any]:
        """Set the session's whole secret set on its proxy (which logs the change, never a value); the
        vault takes it once the proxy did."""
        async with self._lock(egress.session_id):
            return await self._set_secrets(egress, secret_set, actor)

    async def _set_secrets(self, egress: Egress, secret_set: SecretSet, actor: str) -> dict[str, Any]:
        try:
            reply = await self._call(egress, secret_set.message(actor))
        except EgressUnavailable:
            # The proxy applies a set whole or not at all, but its answer may be lost: when its status
            # shows the new set (names, and the digest of each value), the change took.
            status = await self._holding(egress, secret_set)
            if status is None:
                self.vault.send_failed(egress.session_id, secret_set)
                raise
            reply = status
            log.warning("egress proxy of %s took secrets %s; its answer was lost", egress.session_id, secret_set.names)
        self._observe(egress.session_id, reply, "poll")
        self.vault.keep(egress.session_id, secret_set)
        return reply

    async def _holding(self, egress: Egress, secret_set: SecretSet) -> dict[str, Any] | None:
        """The proxy's status when it holds ``secret_set``; None when it does not or cannot say."""
        try:
            status = await self._call(egress, {"op": "status"})
        except EgressUnavailable:
            return None
        held = status.get("secrets")
        if isinstance(held, dict) and secret_set.held_by(held, self.token(egress.session_id)):
            return status
        return None

    async def _set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str, reason: str) -> dict[str, Any]:
        before = self.expected(egress.session_id)
        reply = await self._call(egress, {"op": "policy", "allow": allow, "mode": mode, "actor": actor})
        now = PolicyView.from_reply(reply)
        if before is not None and now.generation != before.generation + 1 and reason != "reassert":
            # The proxy counted a change the gateway did not make (since its last check).
            log.error(
                "egress policy of %s: the proxy's generation is %d after this change, the gateway's last was %d: "
                "someone else changed the proxy's policy",
                egress.session_id,
                now.generation,
                before.generation,
            )
        head = _head(reply)
        if head is None:
            self._expected[egress.session_id] = now  # a proxy from before generations: nothing to anchor
        else:
            self._expect(egress.session_id, now, reason, *head)
        return reply

    def record_start(self, session_id: str, allow: list[str], mode: str) -> None:
        """The policy a new proxy starts with (generation 0), kept where the proxy cannot write."""
        self._expect(session_id, PolicyView(0, canonical_allow(allow), mode), "start", 0, audit.GENESIS)

    def expected(self, session_id: str) -> PolicyView | None:
        """The policy the gateway last set on the session's proxy (read back after a gateway restart)."""
        view = self._expected.get(session_id)
        if view is None:
            stored = self.anchors.expected_policy(session_id)
            if stored is not None:
                view = self._expected[session_id] = PolicyView.from_reply(stored)
        return view

    def _expect(self, session_id: str, view: PolicyView, reason: str, seq: int, chain_hash: str) -> None:
        self.anchors.append(session_id, seq, chain_hash, reason, generation=view.generation, set=view.record())
        self._expected[session_id] = view

    def _observe(self, session_id: str, reply: dict[str, Any], reason: str) -> None:
        """Anchor the proxy's chain head when it moved; say so loudly when it went back or changed."""
        head = _head(reply)
        if head is None:
            log.debug("egress proxy of %s reports no chain head (an older image): nothing anchored", session_id)
            return
        seq, chain_hash = head
        last = self.anchors.last_head(session_id)
        if last is not None and (seq < last[0] or (seq == last[0] and chain_hash != last[1])):
            log.error(
                "the audit chain of %s is not the one anchored: head (%d, %s) after (%d, %s); truncated or rewritten",
                session_id,
                seq,
                chain_hash[:12],
                *last,
            )
        if last != (seq, chain_hash) or reason == "end":
            self.anchors.append(session_id, seq, chain_hash, reason, generation=reply.get("generation"))

    async def check(self, egress: Egress) -> bool:
        """The watchdog's look at a running proxy: its head anchored, its policy and secrets the gateway's.

        A generation or policy the gateway did not set means someone else holds the gateway's token
        (or wrote the proxy's policy file and restarted it): logged as an error, and the gateway's
        policy is set again at once (in the chain as a ``policy`` record by ``gateway:reassert``).
        Secrets the proxy lacks (it restarted, and keeps no values) are sent again the same way.
        Returns False when it had to do either.
        """
        async with self._lock(egress.session_id):
            reply = await self._call(egress, {"op": "status"}, POLL_TIMEOUT_S)
            self._observe(egress.session_id, reply, "poll")
            head = _head(reply)
            if head is None or "generation" not in reply:
                return True  # a proxy from an image before policy generations: nothing to compare
            policy_held = await self._check_policy(egress, reply, head)
            return await self._check_secrets(egress, reply) and policy_held

    async def _check_policy(self, egress: Egress, reply: dict[str, Any], head: tuple[int, str]) -> bool:
        live = PolicyView.from_reply(reply)
        expected = self.expected(egress.session_id)
        if expected is None:
            # A session from before anchors existed: nothing to hold the proxy to but itself.
            log.warning(
                "no policy on record for %s; taking the proxy's (generation %d)", egress.session_id, live.generation
            )
            self._expect(egress.session_id, live, "adopted", *head)
            return True
        if live == expected:
            return True
        log.error(
            "egress policy of %s changed behind the gateway's back: the proxy runs generation %d (%s, %s), "
            "the gateway set generation %d (%s, %s); setting the gateway's policy again",
            egress.session_id,
            live.generation,
            live.mode,
            list(live.allow),
            expected.generation,
            expected.mode,
            list(expected.allow),
        )
        await self._set_policy(egress, list(expected.allow), expected.mode, REASSERT_ACTOR, "reassert")
        return False

    async def _check_secrets(self, egress: Egress, reply: dict[str, Any]) -> bool:
        """The proxy holds the session's secrets (names, and the values the gateway holds, by their
        keyed digests), values loaded; else they are sent again. After a gateway restart the values
        it no longer has go without one (the proxy keeps its own); when the proxy lost them too,
        that is said once."""
        status = reply.get("secrets")
        if not isinstance(status, dict):
            return True  # a proxy from an image before secrets: the session has none
        expected = self.vault.get(egress.session_id)
        names = sorted(str(name) for name in status.get("names") or ())
        held = expected.held_by(status, self.token(egress.session_id))
        if held and (status.get("loaded") is True or not names):
            return True
        pending = self.vault.pending(egress.session_id)
        if pending is not None and pending.held_by(status, self.token(egress.session_id)):
            # A change whose answer was lost took after all: it is the session's now.
            log.warning("egress proxy of %s holds secrets %s, a change whose answer was lost", egress.session_id, names)
            self.vault.keep(egress.session_id, pending)
            return True
        missing = expected.missing_values()
        if held and missing:
            if self.vault.first_warning(egress.session_id):
                log.warning(
                    "egress proxy of %s holds secrets %s without values; this gateway restarted since they were "
                    "set and holds no values for %s: requests using them are refused until the owner sets them "
                    "again (PATCH /v1/sessions/%s)",
                    egress.session_id,
                    names,
                    missing,
                    egress.session_id,
                )
            return True
        log.warning(
            "egress proxy of %s holds secrets %s (values loaded: %s), not the set the gateway set (%s); "
            "sending them again",
            egress.session_id,
            names,
            status.get("loaded"),
            expected.names,
        )
        try:
            await self._set_secrets(egress, expected, REASSERT_ACTOR)
        except EgressUnavailable as exc:
            log.error("egress proxy of %s did not take its secrets again: %s", egress.session_id, exc)
        return False

    # -- watchdog -------------------------------------------------------------------------------------

    async def revive(
        self, egresses: list[Egress], states: Mapping[str, State] | None = None
    ) -> tuple[dict[str, Egress], list[str]]:
        """Restart every proxy that is not running (its sandbox has no egress meanwhile).

        ``states`` is the instance's proxies by session, when the caller listed them already (the
        reaper's tick lists them once for the pool and this): every one of ``egresses`` must have
        existed before that listing, or it would read as gone. None: listed here.

        Returns the restarted ones (by session, with their address as it is now) and the sessions
        whose proxy is gone altogether, which the caller ends: no proxy, no session.
        """
        if not egresses:
            return {}, []
        if states is None:
            states = await asyncio.to_thread(self._runtime.proxy_states, {"corral.gateway": self._settings.instance})
        # The running ones: policy checked, chain head anchored (all at once, each with a short timeout).
        await asyncio.gather(*(self._check_quietly(e) for e in egresses if states.get(e.session_id) == "running"))
        revived: dict[str, Egress] = {}
        gone: list[str] = []
        for egress in egresses:
            state = states.get(egress.session_id)
            if state in PROXY_BUSY_STATES:
                continue
            if state is None:
                log.error("egress proxy %s is gone; ending session %s", egress.proxy_name, egress.session_id)
                gone.append(egress.session_id)
                continue
            log.warning("egress proxy %s is %s; restarting it", egress.proxy_name, state)
            try:
                proxy = await asyncio.to_thread(self._runtime.restart_proxy, egress.session_id)
                address = proxy.address or egress.proxy_address
                revived[egress.session_id] = dataclasses.replace(egress, proxy_address=address)
            except SandboxError as exc:
                log.error("cannot restart egress proxy %s: %s", egress.proxy_name, exc)
        return revived, gone

    async def _check_quietly(self, egress: Egress) -> None:
        try:
            await self.check(egress)
        except EgressUnavailable as exc:
            log.debug("egress proxy %s not checked: %s", egress.proxy_name, exc)  # restarting; next round
        except (KeyError, ValueError, TypeError) as exc:
            log.error("egress proxy %s gave an answer without its policy or chain head: %r", egress.proxy_name, exc)

    # -- archive --------------------------------------------------------------------------------------

    def write_meta(self, session_id: str, **fields: Any) -> None:
        path = self.state_dir(session_id) / META_FILE
        meta = json.loads(path.read_text()) if path.exists() else {"session": session_id}
        meta.update(fields)
        write_json(path, meta)

    def meta(self, session_id: str) -> dict[str, Any] | None:
        try:
            path = self.state_dir(session_id) / META_FILE
            loaded: dict[str, Any] = json.loads(path.read_text())
        except (ValueError, OSError):
            return None
        return loaded

    def logs(self, owner: str) -> list[dict[str, Any]]:
        """The audit logs this API key may read, live or ended, newest first."""
        out = []
        for meta_path in self.root.glob(f"ses_*/{META_FILE}"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("owner") != owner:
                continue
            size, count = _size_and_lines(meta_path.parent / AUDIT_FILE)
            out.append(
                {
                    "session": meta["session"],
                    "state": "ended" if meta.get("ended_at") else "live",
                    "created_at": meta.get("created_at"),
                    "ended_at": meta.get("ended_at"),
                    "records": count,
                    "bytes": size,
                }
            )
        return sorted(out, key=lambda item: item.get("created_at") or 0, reverse=True)

    def prune(self, retention_s: float, live: set[str]) -> int:
        """Remove ended sessions' egress state older than the retention; returns how many."""
        removed = 0
        cutoff = time.time() - retention_s
        for state in self.root.glob("ses_*"):
            # Pool pairs that never served a session have no metadata: nobody's log, gone after retention.
            if not (state / META_FILE).exists() and state.name not in live and state.stat().st_mtime < cutoff:
                shutil.rmtree(state, ignore_errors=True)
                self._remove_anchors(state.name)
                removed += 1
        for meta_path in self.root.glob(f"ses_*/{META_FILE}"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            ended = meta.get("ended_at")
            if ended and ended < cutoff and meta.get("session") not in live:
                shutil.rmtree(meta_path.parent, ignore_errors=True)
                self._remove_anchors(meta_path.parent.name)
                removed += 1
        return removed

    def _remove_anchors(self, session_id: str) -> None:
        try:
            self.anchors.remove(session_id)
        except (ValueError, OSError) as exc:
            log.warning("cannot remove the audit anchors of %s: %s", session_id, exc)


def _size_and_lines(path: Path, chunk: int = 1 << 20) -> tuple[int, int]:
    """A log's bytes and records (its non-blank lines), read a chunk at a time: however long a line
    (a proxy could write one without end), the gateway holds one chunk."""
    try:
        log_file = path.open("rb")
    except FileNotFoundError:
        return 0, 0
    lines, open_line = 0, False  # open_line: the line being read has something on it
    with log_file:
        size = os.fstat(log_file.fileno()).st_size
        while data := log_file.read(min(chunk, size - log_file.tell())):
            *ended, rest = data.split(b"\n")
            for segment in ended:
                lines += 1 if open_line or segment.strip() else 0
                open_line = False
            open_line = open_line or bool(rest.strip())
    return size, lines + (1 if open_line else 0)


def _event_of(line: bytes) -> str:
    """The event of one audit line; "" for a line that is no record (a torn write, garbage)."""
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    return str(record.get("event", "")) if isinstance(record, dict) else ""


def _head(reply: dict[str, Any]) -> tuple[int, str] | None:
    """The chain head ``(seq, hash)`` of a control answer; None from a proxy too old to report it."""
    head = reply.get("head")
    if not isinstance(head, dict):
        return None
    seq, chain_hash = head.get("seq"), head.get("hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(chain_hash, str):
        return None
    return seq, chain_hash
