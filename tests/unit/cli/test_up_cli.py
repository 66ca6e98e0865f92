"""`corral up` and `corral images build` off a terminal: plain progress lines, each with its task, in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from corral import cli, images
from corral.cli import common, lifecycle


class FakeRuntime:
    def __init__(self) -> None:
        self.composed: list[list[str]] = []

    def compose(self, project_dir: object, args: list[str]) -> None:
        self.composed.append(args)


def _builds(task: Callable[[str], images.BuildTask]) -> list[str]:
    desktop, egress = task("desktop"), task("egress")
    desktop.step("debootstrap bookworm")
    egress.output("Step 4/14 : RUN apt-get install python3")
    egress.output("Unpacking python3.13 ...")  # a builder's line: no line of its own
    egress.done("built corral-egress:latest")
    desktop.done("built corral-desktop:latest")
    return ["corral-desktop:latest", "corral-egress:latest"]


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    fake = FakeRuntime()
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_PORT", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)  # the gateway makes its own
    monkeypatch.setattr(common, "runtime", lambda: fake)
    monkeypatch.setattr(lifecycle, "wait_for_gateway", lambda runtime: None)
    monkeypatch.setattr(images, "build_all", lambda runtime, task: _builds(task))
    return fake


def _lines(output: str) -> list[str]:
    return [line.split("] ", 1)[-1] for line in output.splitlines()]


def test_up_off_a_terminal_prints_each_step_as_a_line(runtime: FakeRuntime, capsys: Any) -> None:
    result = CliRunner().invoke(cli.app, ["up"])
    assert result.exit_code == 0, result.output
    assert _lines(capsys.readouterr().err + result.output)[:6] == [
        "desktop: debootstrap bookworm",
        "egress: Step 4/14 : RUN apt-get install python3",
        "egress: built corral-egress:latest",
        "desktop: built corral-desktop:latest",
        "starting the gateway",
        "gateway up on http://127.0.0.1:8700  (API key: `corral status`)",
    ]
    assert runtime.composed == [["up", "-d", "--no-build", "gateway"]]


@pytest.mark.parametrize(
    ("key", "why"),
    [("test-key-a", "is 10 characters long, under 32"), ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "one kind")],
)
def test_up_refuses_a_key_too_guessable_to_hold_before_starting_anything(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, capsys: Any, key: str, why: str
) -> None:
    monkeypatch.setenv("CORRAL_API_KEY", key)
    result = CliRunner().invoke(cli.app, ["up"])
    said = capsys.readouterr().err + result.output
    assert result.exit_code != 0
    assert "CORRAL_API_KEY: the API key" in said and why in said and "secrets.token_urlsafe(32)" in said, said
    assert key not in said  # the key itself is never printed
    assert runtime.composed == []  # nothing built, nothing started


def test_up_starts_with_a_strong_key(runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_API_KEY", "up-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf")
    result = CliRunner().invoke(cli.app, ["up"])
    assert result.exit_code == 0, result.output
    assert runtime.composed == [["up", "-d", "--no-build", "gateway"]]
