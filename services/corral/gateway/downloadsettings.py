"""The settings of the browser's downloads (docs/downloads.md): the caps each sandbox is started
with. A base of :class:`~corral.gateway.settings.GatewaySettings`, read from ``CORRAL_*`` alike;
apart only so that no class holds everything."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from corral.contracts.downloads import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_SESSION_BYTES


class DownloadSettings(BaseSettings):
    download_max_file_mb: int = Field(
        default=DEFAULT_MAX_FILE_BYTES >> 20,
        ge=1,
        description=(
            "A download in a session's browser past this is cancelled and listed `capped` "
            "([downloads.md](downloads.md)); each sandbox is started with it."
        ),
    )
    download_max_session_mb: int = Field(
        default=DEFAULT_MAX_SESSION_BYTES >> 20,
        ge=1,
        description="A download that takes a session's downloads past this in all is cancelled and listed `capped`.",
    )

    def download_environment(self) -> dict[str, str]:
        """The caps as the sandbox's controller reads them (corral.sandbox.settings)."""
        return {
            "CORRAL_DOWNLOAD_MAX_FILE_BYTES": str(self.download_max_file_mb << 20),
            "CORRAL_DOWNLOAD_MAX_SESSION_BYTES": str(self.download_max_session_mb << 20),
        }
