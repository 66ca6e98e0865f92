"""The ``corral`` command line: build the images, run a local sandbox, send it actions."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from corral import images
from corral.client import SandboxClient
from corral.errors import CorralError
from corral.runtime.docker import DockerRuntime, SandboxContainer, SandboxSpec

DEV_SANDBOX = "corral-dev"

app = typer.Typer(help="Corral: disposable desktops with Chromium for computer-use agents.", no_args_is_help=True)
images_app = typer.Typer(help="Build Corral's images.", no_args_is_help=True)
app.add_typer(images_app, name="images")
console = Console(stderr=True)


def _runtime() -> DockerRuntime:
    try:
        return DockerRuntime()
    except CorralError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


def _dev(runtime: DockerRuntime) -> SandboxContainer:
    sandbox = runtime.find(DEV_SANDBOX)
    if sandbox is None:
        console.print("[red]no local sandbox is running; start one with `corral up`[/red]")
        raise typer.Exit(1)
    return sandbox


def _build(runtime: DockerRuntime) -> None:
    with console.status("building corral-desktop (cached layers make a rebuild take seconds)") as status:

        def show(line: str) -> None:
            if line.startswith("Step ") or not line.startswith(" "):
                status.update(f"[bold]building corral-desktop[/bold]: {line[:100]}")

        images.build_desktop(runtime, show)


@images_app.command("build")
def images_build() -> None:
    """Build corral-desktop:latest (and a local Debian base where no registry answers)."""
    runtime = _runtime()
    try:
        _build(runtime)
    except CorralError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(f"[green]built {images.DESKTOP_IMAGE}[/green]")


@app.command()
def up(
    port: Annotated[int, typer.Option(help="Host port on 127.0.0.1 for the controller.")] = 8765,
    screen: Annotated[str, typer.Option(help="Screen size, WIDTHxHEIGHT.")] = "1280x800",
    build: Annotated[bool, typer.Option(help="Build the image first (seconds when cached).")] = True,
) -> None:
    """Start a local sandbox and print where its WebSocket answers."""
    runtime = _runtime()
    try:
        if build:
            _build(runtime)
        runtime.remove(DEV_SANDBOX)
        sandbox = runtime.start_sandbox(SandboxSpec(name=DEV_SANDBOX, host_port=port, screen=screen))
        seconds = runtime.wait_ready(sandbox)
    except CorralError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(f"[green]sandbox ready in {seconds:.1f}s[/green]")
    typer.echo(json.dumps({"name": sandbox.name, "ws_url": sandbox.ws_url, "http": sandbox.base_url}))
    console.print('try: corral do \'{"type": "screenshot"}\' -o shot.png')


@app.command()
def down() -> None:
    """Stop and remove the local sandbox."""
    _runtime().remove(DEV_SANDBOX)
    console.print("[green]removed[/green]")


@app.command()
def status() -> None:
    """Whether the local sandbox runs, and where."""
    runtime = _runtime()
    sandbox = runtime.find(DEV_SANDBOX)
    typer.echo(json.dumps(None if sandbox is None else {"name": sandbox.name, "ws_url": sandbox.ws_url}))


def _strip_images(reply: dict[str, Any], output: Path | None) -> dict[str, Any]:
    shot = reply.get("screenshot")
    if isinstance(shot, dict) and "data" in shot:
        data = base64.b64decode(shot.pop("data"))
        if output is not None:
            output.write_bytes(data)
            shot["saved_to"] = str(output)
        shot["bytes"] = len(data)
    return reply


@app.command("do")
def do(
    message: Annotated[
        str, typer.Argument(help="A native action, or a whole message with 'action', 'anthropic' or 'openai'.")
    ],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the screenshot here.")] = None,
) -> None:
    """Send one message to the local sandbox and print the reply (the image goes to --output)."""
    try:
        payload = json.loads(message)
    except json.JSONDecodeError as exc:
        console.print(f"[red]not JSON: {exc}[/red]")
        raise typer.Exit(2) from None
    if isinstance(payload, dict) and not ({"action", "anthropic", "openai"} & payload.keys()):
        payload = {"action": payload}
    if output is not None and isinstance(payload, dict) and "screenshot" not in payload and "action" in payload:
        payload["screenshot"] = True
    with SandboxClient(_dev(_runtime()).ws_url) as client:
        reply = client.request(payload)
    typer.echo(json.dumps(_strip_images(reply, output), ensure_ascii=False))
    if not reply.get("ok"):
        raise typer.Exit(1)


@app.command()
def screenshot(
    output: Annotated[Path, typer.Option("-o", "--output")] = Path("shot.png"),
    fmt: Annotated[str, typer.Option("--format")] = "png",
) -> None:
    """Save a screenshot of the local sandbox."""
    with SandboxClient(_dev(_runtime()).ws_url) as client:
        output.write_bytes(client.screenshot(fmt))
    console.print(f"saved {output}")


def main() -> None:
    app()
