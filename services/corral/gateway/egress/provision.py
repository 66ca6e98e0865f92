"""The egress pair's life through the runtime: its network and CA made (ahead, as a ground, or at a
claim), its proxy started, restarted and torn down. State lives on the host under
``<data_dir>/egress/<session>/`` (bind-mounted into the proxy), so logs outlive sessions and a
restarted proxy continues the same chain with the same CA and policy."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from corral.contracts import auth as sandbox_auth
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import private_dir
from corral.proxy import ca, control
from corral.proxy.control import AUDIT_FILE, REPLAY_FILE
from corral.runtime import SESSION_LABEL, ProxySpec, SandboxRuntime, State, hostguard

from .ledger import PolicyLedger
from .pairs import (
    GROUND_CA_MARGIN_S,
    GROUND_MAX_AGE_S,
    PROXY_FAILED_STATES,
    PROXY_MEMORY_MB,
    PROXY_TOKEN_FILE,
    STRICTEST_MODE,
    Egress,
    Ground,
    Prepared,
)
from .state import EgressState, ProxyTokens

log = logging.getLogger(__name__)


class Provisioner:
    """Makes, starts, restarts and removes egress pairs through the runtime."""

    def __init__(
        self,
        settings: GatewaySettings,
        runtime: SandboxRuntime,
        state: EgressState,
        tokens: ProxyTokens,
        ledger: PolicyLedger,
    ) -> None:
        self._settings = settings
        self._runtime = runtime
        self._state = state
        self._tokens = tokens
        self._ledger = ledger

    async def start(self) -> bool:
        """The egress network, the archive and the token key; returns whether the host guard holds
        on the egress network."""
        guarded = await asyncio.to_thread(self._runtime.ensure_egress_network, self._settings.egress_network)
        private_dir(self._state.root)
        self._tokens.key()
        unclaimed = await asyncio.to_thread(self._state.remove_unclaimed_grounds)
        if unclaimed:
            log.info("removed the state of %d session grounds made ahead and never taken", len(unclaimed))
        return guarded

    def make_ground_blocking(self, session_id: str, labels: dict[str, str], proxy: bool = False) -> Ground:
        """A session's network (guarded by the runtime), state directory and CA, before anyone asks for
        it (blocking: run it in a thread); with ``proxy``, its proxy started too, in enforce mode with
        nothing allowed (no policy file: an empty allowlist), and the sandbox's copy of its controller
        token written. Marked unclaimed until :meth:`prepare_blocking` takes it."""
        made_at = time.time()
        network = self._runtime.create_session_network(session_id, labels, self._settings.session_subnets)
        try:
            state, authority = self._state.ground_state(session_id)
            ground = Ground(session_id, network, state, authority.cert_pem, made_at, authority.not_after)
            if not proxy:
                return ground
            token = secrets.token_urlsafe(24)
            self._state.write_sandbox_token(session_id, token)
            environment = self.proxy_environment(session_id, token, STRICTEST_MODE)
            prepared = Prepared(session_id, network, state, labels, environment, {}, False)
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

    def drop_ground_blocking(self, ground: Ground) -> None:
        """Undo :meth:`make_ground_blocking` for a ground no session took: nothing of it is kept."""
        if ground.egress is not None:
            self._runtime.remove_egress(ground.session_id)  # its proxy, then its network
        else:
            self._runtime.remove_session_network(ground.network)
        self.forget_blocking(ground.session_id)

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
        sandbox_env = {"CORRAL_PROXY_CONTROL_PORT": str(control.CONTROL_PORT), "CORRAL_CA_CERT": ground.ca_cert}
        token_file = self._state.sandbox_secrets_dir(session_id) / PROXY_TOKEN_FILE
        files = {str(token_file): str(sandbox_auth.PROXY_TOKEN_FILE)}
        try:
            if ground.egress is not None and replay is None:
                # Its proxy runs already, in the strictest state; the session's policy is set on it
                # (set_start_policy) while the sandbox starts, before the session's token is returned.
                self._ledger.record_start(session_id, [], STRICTEST_MODE)
                self._state.ground_marker(session_id).unlink(missing_ok=True)  # last: the state is a session's
                return Prepared(session_id, network, state, labels, {}, sandbox_env, False, files, ground.egress)
            controller_token = self._claim(ground, allow, mode, replay)
        except BaseException:
            self._runtime.remove_egress(session_id)  # a proxy started ahead (by name), and the network
            self.forget_blocking(session_id)
            raise
        environment = self.proxy_environment(session_id, controller_token, mode, hermetic=replay is not None)
        return Prepared(session_id, network, state, labels, environment, sandbox_env, replay is not None, files)

    def _claim(self, ground: Ground, allow: list[str], mode: str, replay: Path | None) -> str:
        """A ground made a session's whose proxy starts now; returns the proxy's controller token."""
        session_id, state = ground.session_id, ground.state_dir
        if ground.egress is not None:
            # A hermetic session's proxy starts differently (no way out, answers from the replay):
            # the one started ahead goes, with the chain it began, and this one starts afresh.
            self._runtime.remove(ground.egress.proxy_id)
            (state / AUDIT_FILE).unlink(missing_ok=True)
        self._state.claim_ground(state, allow, mode, replay)
        self._ledger.record_start(session_id, allow, mode)
        controller_token = secrets.token_urlsafe(24)
        self._state.write_sandbox_token(session_id, controller_token)
        # Last: from here the state is a session's, and a restarted gateway keeps it.
        self._state.ground_marker(session_id).unlink(missing_ok=True)
        return controller_token

    def proxy_environment(
        self, session_id: str, controller_token: str, mode: str, hermetic: bool = False
    ) -> dict[str, str]:
        """The proxy's environment (its tokens included: in the container, never on disk here)."""
        s = self._settings
        return {
            "CORRAL_SESSION": session_id,
            "CORRAL_GATEWAY_TOKEN": self._tokens.token(session_id),
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
                memory=f"{_proxy_memory_mb(prepared)}m",
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

    def forget_blocking(self, session_id: str) -> None:
        """Everything on disk of a session that never was one (its state, the sandbox's secrets, its
        ground marker, its anchors) and the ledger's memory of it. Its proxy and network must be gone."""
        self._state.erase(session_id)
        self._ledger.remove(session_id)
        self._ledger.forget(session_id)

    def remove_egress_blocking(self, session_id: str) -> None:
        """The session's proxy (by name, if it started) and its network."""
        self._runtime.remove_egress(session_id)

    def remove_blocking(self, egress: Egress) -> None:
        """Remove the proxy and the network; the state (audit log) stays."""
        # Drained: the proxy's shutdown writes out the responses still queued for the file.
        self._runtime.remove_egress(egress.session_id, drain=True)
        self._state.end(egress.session_id)

    def restart_blocking(self, egress: Egress) -> Egress:
        """The session's proxy restarted; the pair with its address as it is now."""
        proxy = self._runtime.restart_proxy(egress.session_id)
        return dataclasses.replace(egress, proxy_address=proxy.address or egress.proxy_address)

    def stop_blocking(self, session_id: str) -> None:
        """A paused session's proxy stopped, its container, network and state kept."""
        self._runtime.stop_proxy(session_id)

    def sandbox_side(self, session_id: str) -> tuple[dict[str, str], dict[str, str]]:
        """What a new sandbox of this session is given (a resumed one): its environment (the CA it
        trusts) and files (its copy of the proxy's controller token), as the first one was."""
        ca_cert = (self._state.state_dir(session_id) / "ca" / ca.CERT_ONLY).read_text()
        env = {"CORRAL_PROXY_CONTROL_PORT": str(control.CONTROL_PORT), "CORRAL_CA_CERT": ca_cert}
        token_file = self._state.sandbox_secrets_dir(session_id) / PROXY_TOKEN_FILE
        return env, {str(token_file): str(sandbox_auth.PROXY_TOKEN_FILE)}

    def proxy_states_blocking(self) -> Mapping[str, State]:
        """This instance's proxies, by session."""
        return self._runtime.proxy_states({"corral.gateway": self._settings.instance})

    def failed_blocking(self, session_id: str) -> bool:
        """Whether the session's proxy is in a state it will not come up from (or gone)."""
        states = self._runtime.proxy_states({SESSION_LABEL: session_id})
        return states.get(session_id) in PROXY_FAILED_STATES

    def logs_blocking(self, session_id: str, lines: int = 20) -> str:
        return self._runtime.proxy_logs(session_id, lines)


def _proxy_memory_mb(prepared: Prepared) -> int:
    """A hermetic proxy holds every recorded flow in memory: room for them, beside the usual."""
    if not prepared.hermetic:
        return PROXY_MEMORY_MB
    replay = prepared.state_dir / REPLAY_FILE
    size_mb = replay.stat().st_size >> 20 if replay.exists() else 0
    return PROXY_MEMORY_MB + 3 * size_mb
