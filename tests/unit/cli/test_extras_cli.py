"""A command whose extra is not installed: a clean failure naming the extra and the pip line that adds
it, simulated here by hiding the extra's module (``sys.modules[name] = None``: its import fails as an
absent one's does). The real client install: tests/packaging."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import corral.mcp
from corral import cli
from corral.cli import common, extras


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """One line per message, so the install line is read whole."""
    monkeypatch.setattr(common, "console", Console(stderr=True, width=400))


def _hide(monkeypatch: pytest.MonkeyPatch, missing: str, *loaded: str) -> None:
    """``missing`` (and each submodule of it an earlier test loaded) cannot be imported, and the
    modules that import it are loaded afresh."""
    for name in [name for name in sys.modules if name.startswith(f"{missing}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, missing, None)
    for name in [name for name in sys.modules if any(name == top or name.startswith(f"{top}.") for top in loaded)]:
        monkeypatch.delitem(sys.modules, name, raising=False)  # a package is loaded afresh with its modules


def test_a_server_command_without_the_docker_sdk_names_the_server_extra(
    monkeypatch: pytest.MonkeyPatch, wide: None, capsys: Any
) -> None:
    _hide(monkeypatch, "docker", "corral.runtime.docker")
    result = CliRunner().invoke(cli.app, ["down"])
    said = capsys.readouterr().err + result.output
    assert result.exit_code == 1
    assert "`corral down` needs Corral's server extra (no module named 'docker' here)" in said, said
    assert re.search(r"pip install (-e )?'[^']+\[server\]'", said), said
    assert extras.install_line("server") in said


def test_corral_mcp_without_the_mcp_sdk_names_the_mcp_extra(
    monkeypatch: pytest.MonkeyPatch, wide: None, capsys: Any
) -> None:
    _hide(monkeypatch, "mcp", "corral.mcp.stdio", "corral.mcp.server")
    monkeypatch.delitem(vars(corral.mcp), "serve_stdio", raising=False)  # a test's patch may have left it
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")
    result = CliRunner().invoke(cli.app, ["mcp"])
    said = capsys.readouterr().err + result.output
    assert result.exit_code == 1
    assert "`corral mcp` needs Corral's mcp extra" in said and extras.install_line("mcp") in said, said
    assert result.stdout == ""  # stdout is the protocol's


def test_a_missing_module_of_no_extra_is_not_blamed_on_one() -> None:
    assert extras.missing(ModuleNotFoundError("no numpy", name="numpy"), "server", "up") is None
    said = extras.missing(ModuleNotFoundError("no Xlib.XK", name="Xlib.XK"), "replay", "replay")
    assert said is not None and said.startswith("`corral replay` needs Corral's replay extra")


def test_without_the_docker_sdk_no_stored_key_is_read(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """A client install has no compose gateway to read a key from: no key is the usual failure."""
    _hide(monkeypatch, "docker", "corral.runtime.docker")
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    monkeypatch.setattr(common, "runtime", lambda: pytest.fail("read the compose gateway's key"))
    result = CliRunner().invoke(cli.app, ["session", "ls"])
    assert result.exit_code == 1
    assert "no API key: set CORRAL_API_KEY" in capsys.readouterr().err + result.output
