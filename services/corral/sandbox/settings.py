"""The controller's settings, from ``CORRAL_*`` environment variables; injected, never global.

A plain pydantic model read by :meth:`ControllerSettings.from_environ`, not pydantic-settings: that
package's import is about 4 MiB of every idle sandbox's memory (bench/gateway.py's idle session), for
what is here a dozen lines. The gateway, one per host, keeps pydantic-settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from corral.contracts import auth
from corral.contracts.downloads import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_SESSION_BYTES
from corral.contracts.limits import MAX_FRAME_BYTES
from corral.protocol.envelope import Limits
from corral.sandbox.agent.launcher.messages import SOCKET_PATH
from corral.sandbox.agent.processes import ProcessSettings
from corral.sandbox.egress import ActionReporter
from corral.sandbox.kernels.contexts import KernelSettings

DEFAULT_LIMITS = Limits()


ENV_PREFIX = "CORRAL_"


class ControllerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    display: str = Field(default=":0", validation_alias="DISPLAY")
    cdp_url: str = "http://127.0.0.1:9222"
    # The Playwright driver (node, about 80 MiB PSS) is stopped after this long without a browser
    # call (0: kept for good); the next browser call starts it again (about 0.3 s). Chromium keeps its tabs.
    browser_idle_stop_s: float = 45.0
    host: str = "0.0.0.0"
    port: int = 8765
    max_message_bytes: int = DEFAULT_LIMITS.max_message_bytes
    # Frames above this size close the WebSocket (1009); up to it, oversize gets a structured error.
    ws_max_frame_bytes: int = MAX_FRAME_BYTES
    action_timeout_ms: int = DEFAULT_LIMITS.timeout_ms
    max_action_timeout_ms: int = DEFAULT_LIMITS.max_timeout_ms
    settle_timeout_ms: int = DEFAULT_LIMITS.settle_timeout_ms
    settle_quiet_ms: int = DEFAULT_LIMITS.settle_quiet_ms
    settle_poll_ms: int = 15
    # The least time after an action (or the page's last request) before the screen counts as settled.
    settle_min_ms: int = DEFAULT_LIMITS.settle_min_ms
    type_chunk_chars: int = 200
    # Pause after binding spare keycodes to new characters, before typing them (see xinput.bind_for).
    keymap_settle_ms: int = 60
    log_level: str = "info"
    # The session's egress proxy (host:port) and its control channel; empty without egress control.
    proxy: str = ""
    proxy_control_port: int = 8081
    # Secrets live in files only the controller's uid reads, never in its environment: boot moves the
    # egress control channel's token there and writes the per-boot secret (corral.contracts.auth).
    controller_token_file: Path = auth.PROXY_TOKEN_FILE
    secret_file: Path = auth.SECRET_FILE
    # Keep each request, its reply and a frame after it for the gateway's session recording.
    record: bool = True
    # PUT /v1/files: the largest body taken (413 too_large above it, nothing kept).
    max_upload_bytes: int = 1 << 30
    # GET /v1/files: the largest file or directory sent (413 too_large above it) unless the gateway's
    # request names its own cap (max_bytes, its CORRAL_MAX_DOWNLOAD_BYTES).
    max_download_bytes: int = 1 << 30
    # The browser's downloads (corral.sandbox.web.downloadbook): one past this, or one that takes the
    # session's downloads past the second, is cancelled and marked ``capped`` (the gateway's
    # CORRAL_DOWNLOAD_MAX_FILE_MB and CORRAL_DOWNLOAD_MAX_SESSION_MB, handed on at the sandbox's start).
    download_max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, ge=0)
    download_max_session_bytes: int = Field(default=DEFAULT_MAX_SESSION_BYTES, ge=0)
    # Commands and processes (corral.sandbox.agent.processes), run as the agent through the launcher.
    launcher_socket: Path = Path(SOCKET_PATH)
    exec_timeout_ms: int = 60_000
    max_output_bytes: int = 8 << 20  # per stream of one exec's reply; the default is 1 MiB
    process_buffer_bytes: int = 4 << 20  # per stream of each process, for process_output
    process_buffers_total_bytes: int = 64 << 20  # all those rings together (the oldest bytes go first)
    process_captures_total_bytes: int = 64 << 20  # all running execs' stdout/stderr kept for their replies
    max_processes: int = 256
    # run_code (corral.sandbox.kernels): kernels at once (each a Python process of its own), how long
    # one may take to start, and how long a cell interrupted at its timeout has to stop before its
    # kernel is killed and started afresh.
    max_code_contexts: int = Field(default=8, ge=1, le=64)
    kernel_start_timeout_s: float = Field(default=60.0, gt=0)
    kernel_interrupt_grace_s: float = Field(default=3.0, gt=0)
    # The in-sandbox door to the agent's servers (corral.sandbox.previewdoor) on the sandbox's own
    # loopback: 0 is off (a controller run outside the image); the image sets 8701.
    preview_door_port: int = 0
    # What boot writes when the session has a proxy: the system CAs and the session's.
    ca_bundle: Path = Path("/etc/ssl/certs/ca-certificates.crt")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ControllerSettings:
        """The settings that ``environ`` names: ``CORRAL_<FIELD>`` (any case) for each field, and
        ``DISPLAY``; other variables are not the controller's. A bad value raises pydantic's
        ValidationError, naming the field."""
        given: dict[str, Any] = {}
        upper = {key.upper(): value for key, value in environ.items()}
        for name, field in cls.model_fields.items():
            key = field.validation_alias if isinstance(field.validation_alias, str) else ENV_PREFIX + name.upper()
            if key in upper:
                given[name] = upper[key]
        return cls.model_validate(given)

    def process_settings(self) -> ProcessSettings:
        return ProcessSettings(
            exec_timeout_ms=self.exec_timeout_ms,
            max_timeout_ms=self.max_action_timeout_ms,
            output_bytes=min(1 << 20, self.max_output_bytes),
            max_output_bytes=self.max_output_bytes,
            buffer_bytes=self.process_buffer_bytes,
            buffers_total_bytes=self.process_buffers_total_bytes,
            captures_total_bytes=self.process_captures_total_bytes,
            max_processes=self.max_processes,
            proxy=self.proxy,
            ca_bundle=str(self.ca_bundle) if self.proxy else None,
        )

    def kernel_settings(self) -> KernelSettings:
        processes = self.process_settings()
        return KernelSettings(
            max_contexts=self.max_code_contexts,
            start_timeout_s=self.kernel_start_timeout_s,
            interrupt_grace_s=self.kernel_interrupt_grace_s,
            default_timeout_ms=processes.exec_timeout_ms,
            max_timeout_ms=processes.max_timeout_ms,
            output_bytes=processes.output_bytes,
            max_output_bytes=processes.max_output_bytes,
        )

    def action_reporter(self) -> ActionReporter | None:
        token = _read(self.controller_token_file)
        if not self.proxy or not token:
            return None
        return ActionReporter(self.proxy.rpartition(":")[0], self.proxy_control_port, token)

    def limits(self) -> Limits:
        return Limits(
            max_message_bytes=self.max_message_bytes,
            timeout_ms=self.action_timeout_ms,
            max_timeout_ms=self.max_action_timeout_ms,
            settle_timeout_ms=self.settle_timeout_ms,
            settle_quiet_ms=self.settle_quiet_ms,
            settle_min_ms=self.settle_min_ms,
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""
