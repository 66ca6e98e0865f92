"""``corral mcp``: the stdio server, for the gateway and the credential the CLI's environment names."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral import cli, mcp
from corral.cli import common


def test_corral_mcp_serves_stdio_for_the_configured_gateway_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_URL", "http://gateway.test:8700")
    monkeypatch.setenv("CORRAL_API_KEY", "a-session-token")
    served: list[tuple[str, str]] = []
    monkeypatch.setattr(mcp, "serve_stdio", lambda url, credential: served.append((url, credential)))
    result = CliRunner().invoke(cli.app, ["mcp"])
    assert result.exit_code == 0, result.output
    assert served == [("http://gateway.test:8700", "a-session-token")]
    assert result.stdout == ""  # stdout is the protocol's


class NoComposeGateway:
    def read_file(self, container: str, path: str) -> None:
        return None


def test_corral_mcp_without_a_key_fails_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    monkeypatch.setattr(common, "runtime", NoComposeGateway)
    monkeypatch.setattr(mcp, "serve_stdio", lambda url, credential: pytest.fail("served without a key"))
    result = CliRunner().invoke(cli.app, ["mcp"])
    assert result.exit_code == 1
    assert result.stdout == "" and "no API key" in result.stderr
