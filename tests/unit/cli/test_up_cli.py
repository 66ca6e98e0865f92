"""`corral up` and `corral images build` off a terminal: plain progress lines, each with its task, in order."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral import cli, images
from corral.cli import common, datadir, lifecycle


class FakeRuntime:
    def __init__(self) -> None:
        self.composed: list[list[str]] = []
        # What compose would read while it runs: the override named last, and its own environment.
        self.overrides: list[object] = []
        self.environments: list[dict[str, str]] = []
        self.removed: list[dict[str, str]] = []

    def compose(self, project_dir: object, args: list[str]) -> None:
        self.composed.append(args)
        files = [args[i + 1] for i, arg in enumerate(args) if arg == "-f"]
        if files:
            self.overrides.append(json.loads(Path(files[-1]).read_text()))
        self.environments.append(dict(os.environ))

    def remove_all(self, labels: dict[str, str]) -> None:
        self.removed.append(labels)


def _builds(task: Callable[[str], images.BuildTask]) -> list[str]:
    desktop, egress = task("desktop"), task("egress")
    desktop.step("debootstrap bookworm")
    egress.output("Step 4/14 : RUN apt-get install python3")
    egress.output("Unpacking python3.13 ...")  # a builder's line: no line of its own
    egress.done("built corral-egress:latest")
    desktop.done("built corral-desktop:latest")
    return ["corral-desktop:latest", "corral-egress:latest"]


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeRuntime:
    fake = FakeRuntime()
    # A checkout of its own (no operator's corral.env in it); the environment put back after the test.
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    monkeypatch.setattr(images, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_PORT", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)  # the gateway makes its own
    monkeypatch.setattr(common, "runtime", lambda: fake)
    monkeypatch.setattr(lifecycle, "wait_for_gateway", lambda runtime: None)
    # The host's mount table is datadir's own test's (tests/unit/cli/test_datadir.py): here only asked for.
    fake.data_dirs = []  # type: ignore[attr-defined]
    monkeypatch.setattr(datadir, "prepare", lambda path: fake.data_dirs.append(("prepare", path)) or [])  # type: ignore[attr-defined]
    monkeypatch.setattr(datadir, "release", lambda path: fake.data_dirs.append(("release", path)) or [])  # type: ignore[attr-defined]
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
    assert runtime.data_dirs == [("prepare", Path("/var/lib/corral"))]  # type: ignore[attr-defined]


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


STRONG_KEY = "up-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf"


def test_up_hands_every_setting_of_the_env_file_by_name(runtime: FakeRuntime, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = tmp_path / "gateway.env"
    settings.write_text(
        f"CORRAL_API_KEY={STRONG_KEY}\nCORRAL_RECORDING_BUDGET_MB=512\nCORRAL_EGRESS_UPSTREAM_CA={ca}\n"
    )
    settings.chmod(0o600)
    result = CliRunner().invoke(cli.app, ["up", "--no-build", "--env-file", str(settings)])
    assert result.exit_code == 0, result.output
    ((*files, up_args),) = [(*args[:-4], args[-4:]) for args in runtime.composed]
    assert up_args == ["up", "-d", "--no-build", "gateway"]
    assert files[:3] == ["-f", str(tmp_path / "compose.yaml"), "-f"] and len(files) == 4
    assert runtime.overrides == [
        {
            "services": {
                "gateway": {
                    "environment": [
                        "CORRAL_API_KEY",
                        "CORRAL_EGRESS_UPSTREAM_CA=/run/corral/settings/egress_upstream_ca",
                        "CORRAL_RECORDING_BUDGET_MB",
                    ],
                    "volumes": [
                        {
                            "type": "bind",
                            "source": str(ca),
                            "target": "/run/corral/settings/egress_upstream_ca",
                            "read_only": True,
                        }
                    ],
                }
            }
        }
    ]
    (environment,) = runtime.environments
    assert environment["CORRAL_RECORDING_BUDGET_MB"] == "512" and environment["CORRAL_API_KEY"] == STRONG_KEY
    assert STRONG_KEY not in result.output
    assert not Path(files[-1]).exists()  # the override lived for the command only


def test_up_reads_corral_env_at_the_root_and_the_shell_wins(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    (tmp_path / "corral.env").write_text("CORRAL_POOL_SIZE=2\nCORRAL_PORT=8711\n")
    (tmp_path / "corral.env").chmod(0o644)
    monkeypatch.setenv("CORRAL_POOL_SIZE", "0")
    result = CliRunner().invoke(cli.app, ["up", "--no-build"])
    said = " ".join((capsys.readouterr().err + result.output).split())  # as one line: rich wraps
    assert result.exit_code == 0, said
    assert runtime.overrides == [
        {"services": {"gateway": {"environment": ["CORRAL_POOL_SIZE", "CORRAL_PORT"], "volumes": []}}}
    ]
    (environment,) = runtime.environments
    assert (environment["CORRAL_POOL_SIZE"], environment["CORRAL_PORT"]) == ("0", "8711")
    assert "which wins over" in said and "CORRAL_POOL_SIZE" in said
    assert "mode 0644" in said and "chmod 600" in said
    assert "gateway up on http://127.0.0.1:8711" in said  # the CLI waits on the file's port


def test_up_refuses_a_bad_env_file_before_building_or_starting_anything(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    built: list[str] = []
    monkeypatch.setattr(images, "build_all", lambda runtime, task: built.append("built"))
    settings = tmp_path / "corral.env"
    settings.write_text(
        "CORRAL_RECORDNG_BUDGET_MB=512\nCORRAL_API_KEY=secret-but-weak\nCORRAL_EGRESS_UPSTREAM_CA=/nonexistent.pem\n"
    )
    result = CliRunner().invoke(cli.app, ["up"])
    said = " ".join((capsys.readouterr().err + result.output).split())  # as one line: rich wraps
    assert result.exit_code == 2
    assert "3 problems, nothing was started" in said
    assert "did you mean CORRAL_RECORDING_BUDGET_MB" in said and "no such file: /nonexistent.pem" in said
    assert "secret-but-weak" not in said
    assert runtime.composed == [] and built == []


def test_up_refuses_an_env_file_that_is_not_there(runtime: FakeRuntime, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["up", "--env-file", str(tmp_path / "missing.env")])
    assert result.exit_code == 2
    assert runtime.composed == []


def test_down_removes_the_sandboxes_of_the_env_files_instance(runtime: FakeRuntime, tmp_path: Path) -> None:
    (tmp_path / "corral.env").write_text("CORRAL_INSTANCE=blue\n")
    result = CliRunner().invoke(cli.app, ["down"])
    assert result.exit_code == 0, result.output
    assert runtime.composed == [["down"]]
    assert runtime.removed == [{"corral.gateway": "blue"}]
    assert runtime.data_dirs == [("release", Path("/var/lib/corral"))]  # type: ignore[attr-defined]
