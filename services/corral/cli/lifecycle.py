"""``corral up``, ``down`` and ``status``: the compose gateway on this host. ``up`` and ``down`` need
the ``server`` extra (Docker); ``status`` asks any gateway over HTTP."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from corral.cli import common, datadir
from corral.cli.images import build_images, plain
from corral.errors import CorralError
from corral.gateway import keystrength

if TYPE_CHECKING:
    from corral.gateway.envfile import GatewayEnv
    from corral.runtime.docker import DockerRuntime

EnvFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--env-file", help="The gateway's settings, NAME=VALUE a line (default: corral.env at the checkout's root)."
    ),
]


def up(
    build: Annotated[bool, typer.Option(help="Build the image first (seconds when cached).")] = True,
    env_file: EnvFileOpt = None,
) -> None:
    """Build the image and start the gateway (docker compose) on 127.0.0.1:8700."""
    with common.needed("server", "up"):
        from corral import images
        from corral.gateway import envfile

        settings = gateway_env(env_file)
        refuse_a_weak_key()
        runtime = common.runtime()
    try:
        for step in datadir.prepare(datadir.data_dir()):  # compose binds it rshared (workspace volumes)
            plain(step)
        if build:
            build_images(runtime)
        if not common.console.is_terminal:
            plain("starting the gateway")
        with common.console.status("starting the gateway"):
            with envfile.compose_files(images.repo_root(), settings) as files:
                runtime.compose(images.repo_root(), [*files, "up", "-d", "--no-build", "gateway"])
            wait_for_gateway(runtime)
    except CorralError as exc:
        raise common.fail(str(exc)) from None
    common.console.print(f"[green]gateway up on {common.url()}[/green]  (API key: `corral status`)")


def gateway_env(option: Path | None) -> GatewayEnv | None:
    """The env file's settings (corral.gateway.envfile), checked whole before anything starts and put
    in this process's environment, where compose and the CLI's port and instance read them."""
    from corral import images
    from corral.gateway import envfile

    try:
        settings = envfile.read_into(option, images.repo_root(), os.environ)
    except CorralError as exc:
        raise common.fail(str(exc), 2) from None
    if settings is not None:
        for warning in settings.warnings:
            common.console.print(f"[yellow]{escape(warning)}[/yellow]")
        if settings.shadowed:
            common.console.print(
                f"set in your environment too, which wins over {settings.path}: {', '.join(settings.shadowed)}"
            )
    return settings


def refuse_a_weak_key() -> None:
    """``CORRAL_API_KEY`` (what compose hands the gateway) refused before anything starts when a key
    of it is too short or too guessable to hold; the gateway would refuse it too, less visibly."""
    keys = [key.strip() for key in os.environ.get("CORRAL_API_KEY", "").split(",") if key.strip()]
    trouble = keystrength.problem(keys)
    if trouble is not None:
        raise common.fail(trouble)


def wait_for_gateway(runtime: DockerRuntime, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{common.url()}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            logs = runtime.logs(common.GATEWAY_CONTAINER, 30)
            raise common.fail(f"the gateway did not answer on {common.url()}:\n{logs}")
        time.sleep(0.2)


def down(env_file: EnvFileOpt = None) -> None:
    """Stop the gateway and remove its sandboxes (the data dir, with the API key and audit logs, stays)."""
    with common.needed("server", "down"):
        from corral import images

        gateway_env(env_file)  # the instance whose sandboxes go may be set there
        runtime = common.runtime()
    try:
        runtime.compose(images.repo_root(), ["down"])
    except CorralError as exc:
        raise common.fail(str(exc)) from None
    # Sandboxes, their egress proxies and their session networks (audit logs stay in the data dir).
    runtime.remove_all({"corral.gateway": os.environ.get("CORRAL_INSTANCE", "default")})
    for step in datadir.release(datadir.data_dir()):
        plain(step)
    common.console.print("[green]gateway stopped[/green]")


def status(as_json: common.JsonOpt = False) -> None:
    """The gateway's health, its sessions and its API key."""
    try:
        health = httpx.get(f"{common.url()}/v1/health", timeout=5).json()
    except httpx.HTTPError as exc:
        raise common.fail(f"no gateway on {common.url()} ({exc}); start it with `corral up`") from None
    key = common.api_key()
    if as_json:
        common.out.print_json(json.dumps({"url": common.url(), "health": health, "api_key": key}))
        return
    table = Table(show_header=False)
    table.add_row("gateway", common.url())
    for state, count in health["sessions"].items():
        table.add_row(f"sessions {state}", str(count))
    table.add_row("pool target", str(health["pool_target"]))
    table.add_row("API key", key)
    common.out.print(table)
