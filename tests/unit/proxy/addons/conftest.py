"""Fixtures of the egress addons' tests; they need mitmproxy (the proxy's virtualenv, .venv-proxy)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("mitmproxy") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def egress(tmp_path: Path) -> Iterator[tuple[Any, Any, Path]]:
    """A session proxy with an allowlist, its DNS table's lookups, and its state dir."""
    from .harness import Lookups, session_proxy, write_policy

    write_policy(tmp_path, ["allowed.test", "*.allowed.test", "GET,HEAD other.test/docs/"], mode="enforce")
    lookups = Lookups()
    with session_proxy(
        lookups=lookups,
        corral_session="ses_test",
        corral_state_dir=str(tmp_path),
        corral_trusted_networks="203.0.113.0/24",
        corral_gateway_token="gw-token",
        corral_controller_token="ctl-token",
        corral_own_hosts="corral-proxy",
    ) as session:
        yield session, lookups, tmp_path


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[tuple[Any, Any, Path]]:
    """A proxy that keeps the upstream answers it lets through."""
    from .harness import OPTIONS, Lookups, session_proxy, write_policy

    state = tmp_path / "recorded"
    write_policy(state, ["allowed.test", "*.allowed.test"], mode="enforce")
    lookups = Lookups()
    with session_proxy(lookups=lookups, corral_state_dir=str(state), corral_keep_responses=True, **OPTIONS) as session:
        yield session, lookups, state
        session.shared.responses.close()  # type: ignore[union-attr]


@pytest.fixture(autouse=True)
def no_addon_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """mitmproxy logs an exception in an addon's hook and carries on: here it fails the test."""
    yield
    assert "Addon error" not in caplog.text
