"""The client install: the wheel built from this checkout, installed with no extras in a fresh
virtualenv, gives the SDK and the client commands without the server's dependencies, and a
server-only command names the extra it needs (pyproject.toml, docs/design/0294-client-install.md).

Needs an index (PyPI, or pip's configured wheel cache) for the build backend and the client's
dependencies, as scripts/bootstrap does. Prints the install's size and packages (``pytest -s``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]

# Distributions the client install must not hold: the gateway's and the exporter's.
SERVER_ONLY = {
    "docker",
    "fastapi",
    "starlette",
    "uvicorn",
    "imageio-ffmpeg",
    "python-xlib",
    "prometheus-client",
    "pydantic-settings",
    "cryptography",
    "pillow",
    "mcp",
}
# The modules they bring, which no import of the SDK or the CLI may load.
SERVER_MODULES = ["docker", "fastapi", "starlette", "uvicorn", "imageio_ffmpeg", "Xlib", "prometheus_client", "mcp"]


def _clean_env(**env: str) -> dict[str, str]:
    """This environment without what points Python or Corral elsewhere (a PYTHONPATH to the checkout
    would run its code instead of the wheel's)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    kept = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("CORRAL_")}
    return {**kept, **env}


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, check=False, timeout=600, env=_clean_env() if env is None else env
    )


def _name(distribution: str) -> str:
    return distribution.lower().replace("_", "-")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The virtualenv's bin directory and the wheel installed into it (no extras)."""
    work = tmp_path_factory.mktemp("client-install")
    # A copy of what the wheel is built from, so the build leaves nothing in the checkout.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "services", source / "services", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source)])
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("corral-*.whl")
    venv = work / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv / "bin", wheel


def _corral(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # One line per message (COLUMNS): the install line is never wrapped.
    return _run([str(bin_dir / "corral"), *args], env=_clean_env(COLUMNS="400", **env))


def test_the_client_install_holds_no_server_dependency(client: tuple[Path, Path]) -> None:
    bin_dir, _ = client
    listed = _run([str(bin_dir / "python"), "-m", "pip", "list", "--format=json"])
    installed = {_name(row["name"]): row["version"] for row in json.loads(listed.stdout)}
    site = _run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    size = _run(["du", "-sm", site.stdout.strip()]).stdout.split()[0]
    print(f"\nclient install: {size} MiB in site-packages, {len(installed)} distributions:")
    print(" ".join(f"{name}=={version}" for name, version in sorted(installed.items())))
    assert {"corral", "httpx", "websockets", "pydantic", "typer", "rich"} <= installed.keys()
    assert not SERVER_ONLY & installed.keys(), SERVER_ONLY & installed.keys()


def test_the_sdk_and_the_cli_import_without_a_server_module(client: tuple[Path, Path]) -> None:
    bin_dir, _ = client
    probe = (
        "import sys\n"
        "from corral import Sandbox, AsyncSandbox, Gateway, SandboxClient\n"
        "import corral.cli, corral.cli.common, corral.mcp\n"
        f"print(sorted(m for m in {SERVER_MODULES!r} if m in sys.modules))\n"
    )
    imported = _run([str(bin_dir / "python"), "-c", probe])
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"


def test_corral_help_and_a_client_command_against_no_gateway(client: tuple[Path, Path]) -> None:
    bin_dir, _ = client
    helped = _corral(bin_dir, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "session" in helped.stdout and "exec" in helped.stdout
    with socket.socket() as free:  # a loopback port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    listed = _corral(bin_dir, "session", "ls", CORRAL_URL=f"http://127.0.0.1:{port}", CORRAL_API_KEY="k")
    assert listed.returncode == 1
    assert f"no answer from the gateway on http://127.0.0.1:{port}" in listed.stderr
    assert "Traceback" not in listed.stderr and "ImportError" not in listed.stderr


@pytest.mark.parametrize(
    ("args", "command", "extra"),
    [
        (["up", "--no-build"], "up", "server"),
        (["down"], "down", "server"),
        (["images", "build"], "images build", "server"),
        (["mcp"], "mcp", "mcp"),
        (["replay", "nothing.zip"], "replay", "replay"),
        (["export", "video", "nothing.zip"], "export video", "video"),
    ],
)
def test_a_command_of_an_extra_names_it_and_the_wheel(
    client: tuple[Path, Path], args: list[str], command: str, extra: str
) -> None:
    bin_dir, wheel = client
    ran = _corral(bin_dir, *args)
    assert ran.returncode == 1
    assert f"`corral {command}` needs Corral's {extra} extra" in ran.stderr, ran.stderr
    assert f"pip install '{wheel}[{extra}]'" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr
