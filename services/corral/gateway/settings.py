"""The gateway's settings (``CORRAL_*``), injected into the app; never a module global."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from corral.errors import WeakApiKey
from corral.gateway import keystrength


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8700
    data_dir: Path = Path.home() / ".local" / "share" / "corral"
    # Comma-separated; when empty, one key is generated on first start and kept in data_dir.
    api_key: str = ""
    # Where sandboxes run: the runtime driver (corral.runtime.open_runtime; "docker" is the one there is).
    runtime: str = "docker"
    image: str = "corral-desktop:latest"
    network: str = "corral-sandboxes"
    instance: str = "default"

    max_sessions: int = Field(default=8, ge=1)
    max_sessions_per_key: int = Field(default=8, ge=1)
    pool_size: int = Field(default=1, ge=0)
    # Session networks and CAs made ahead (corral.gateway.grounds) for cold starts with egress control.
    ground_pool_size: int = Field(default=2, ge=0)
    # Each ground's proxy started ahead too (enforce, nothing allowed): a cold start then starts only its
    # sandbox and sets the policy; hermetic sessions start their own proxy still.
    ground_proxies: bool = True

    default_timeout_s: int = 3600
    max_timeout_s: int = 24 * 3600
    default_idle_timeout_s: int = 600
    reap_interval_s: float = 1.0
    start_timeout_s: float = 60.0
    # On stop, open requests (an MCP client's event stream, a long exec) get this long to end before they are
    # cancelled and the sessions are stopped: without a bound one held-open stream keeps the gateway up.
    shutdown_grace_s: int = Field(default=8, ge=1)

    # Unset: sized to the host at start (corral.gateway.limits): every core but half of one, at most two; memory
    # so that every session and pooled pair at the cap fits the host's memory, 768-1536 MiB.
    default_cpus: float | None = Field(default=None, gt=0)

    max_cpus: float = 2.0
    default_memory_mb: int | None = Field(default=None, ge=256)
    max_memory_mb: int = 4096
    default_pids: int = 512
    default_shm_mb: int = 256
    default_disk_mb: int = 1024
    max_disk_mb: int = 8192
    # Each sandbox's /workspace (a tmpfs the agent's commands start in; Docker's size syntax: 512m, 1g).
    workspace_size: str = Field(default="1g", pattern=r"^[0-9]+[kmg]?$")
    # JSON bodies of the API (create, change a session) above this are refused (413) unread.
    max_body_kb: int = Field(default=1024, ge=1)
    # /mcp's DNS-rebinding guard: the names (comma-separated, with or without a port) clients reach the
    # gateway by besides the loopback ones; "*" turns the check off (a reverse proxy owns the Host header).
    mcp_allowed_hosts: str = ""
    # /mcp's sessions (the SDK's, one per connected MCP client): at most this many open at once, this many per
    # credential (an API key, or a session's token), each closed after this long without a request or open stream.
    mcp_max_sessions: int = Field(default=256, ge=1)
    mcp_max_sessions_per_caller: int = Field(default=16, ge=1)
    mcp_session_idle_s: float = Field(default=600.0, gt=0)
    # A file uploaded into a session (PUT /v1/sessions/{id}/files) above this is refused (413), nothing kept.
    max_upload_bytes: int = Field(default=1 << 30, ge=1)
    # A file or directory downloaded from a session (GET /v1/sessions/{id}/files) above this is refused (413)
    # when its size is known up front (a file's apparent size, a directory's), else cut where it passes this.
    max_download_bytes: int = Field(default=1 << 30, ge=1)
    # A session whose controller restarts more than this many times in controller_restart_window_s, or does not
    # answer for controller_dead_after_s, is ended (controller_dead): its init cannot keep it up.
    controller_max_restarts: int = Field(default=5, ge=1)
    controller_restart_window_s: float = Field(default=300.0, gt=0)
    controller_dead_after_s: float = Field(default=60.0, gt=0)

    # Egress: every session's traffic goes through its own proxy (corral-egress) on a network of its own.
    egress: bool = True  # off only where sandboxes may reach the network unfiltered (and unlogged)
    egress_image: str = "corral-egress:latest"
    egress_network: str = "corral-egress"
    # Each session's own network gets a /28 from here (pick a range your hosts do not use).
    session_subnets: str = "10.213.0.0/16"
    egress_mode: Literal["enforce", "report"] = "enforce"
    # Comma-separated networks the operator vouches for: exempt from the global deny (private ranges).
    egress_trusted_networks: str = ""
    egress_allow_private: bool = False
    # A CA bundle the proxies trust for upstreams beside the public ones (an internal PKI, a test CA).
    egress_upstream_ca: Path | None = None
    egress_retention_days: float = Field(default=30.0, gt=0)
    # Each session's audit log: past this many bytes its proxy writes one `budget` record, then counts
    # (`tally` records per host, event and decision) instead of traffic records (docs/egress.md).
    audit_max_bytes: int = Field(default=64 << 20, ge=16 << 10)
    # The host uid the proxies run as (they own their state dirs). Unset: 1001 when the gateway runs
    # as root, else the gateway's own uid (only root can give files to another user).
    egress_uid: int | None = Field(default=None, ge=1)

    # Every session is recorded (docs/recording.md); bundles outlive their sessions this long.
    record: bool = True
    recording_retention_days: float = Field(default=30.0, gt=0)
    # Each session's bytes of events and frames; past it the recording notes the cut and stores no
    # more (the session goes on). A session may ask for another budget (recording_mb), up to the cap.
    recording_budget_mb: int = Field(default=256, ge=1)
    recording_max_budget_mb: int = Field(default=2048, ge=1)
    # Per event, each field of recorded text (request, native, reply...) is kept up to this much.
    recording_max_text_kb: int = Field(default=64, ge=1)
    # All recordings in the data dir together; past it, ended ones go, oldest first.
    recordings_max_total_mb: int = Field(default=10240, ge=1)
    # Each session's upstream answers go into its recording (responses.mitm) for hermetic replays.
    record_responses: bool = True
    responses_max_body_mb: int = Field(default=16, ge=1)
    responses_max_total_mb: int = Field(default=256, ge=1)
    # Recorded responses uploaded for hermetic replays (POST /v1/replay-responses), kept this long.
    replay_upload_max_mb: int = Field(default=256, ge=1)
    replay_upload_retention_hours: float = Field(default=24.0, gt=0)

    def api_keys(self) -> list[str]:
        """The keys of ``CORRAL_API_KEY``; :class:`WeakApiKey` when one is too short or too guessable
        to hold (corral.gateway.keystrength: the message says why and what to use)."""
        keys = [key.strip() for key in self.api_key.split(",") if key.strip()]
        trouble = keystrength.problem(keys)
        if trouble is not None:
            raise WeakApiKey(trouble, field="CORRAL_API_KEY")
        return keys
