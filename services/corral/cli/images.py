"""``corral images build``: Corral's images, built side by side (``corral up`` builds them first too).
Needs the ``server`` extra (the Docker SDK)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from corral import progress
from corral.cli import common
from corral.errors import CorralError

if TYPE_CHECKING:
    from corral.runtime.docker import DockerRuntime

images_app = typer.Typer(help="Build Corral's image.", no_args_is_help=True, pretty_exceptions_show_locals=False)


def build_images(runtime: DockerRuntime) -> None:
    """Build the images side by side: a status line on a terminal, plain lines (one every 10 s at
    least) in a log or a pipe, where a status line would print nothing."""
    from corral import images  # with the runtime: the server extra, there by now

    if common.console.is_terminal:
        with common.console.status("building the images (cached layers make a rebuild take seconds)") as status:
            images.build_all(runtime, progress.Progress(common.console.print, status=status).task)
        return
    with progress.Progress(plain) as shown:
        images.build_all(runtime, shown.task)


def plain(line: str) -> None:
    """A progress line as it is (no markup, no wrapping), written at once: a log shows it when it happens."""
    print(line, file=sys.stderr, flush=True)


@images_app.command("build")
def images_build() -> None:
    """Build corral-desktop:latest and corral-egress:latest (and local Debian bases where no registry answers)."""
    with common.needed("server", "images build"):
        runtime = common.runtime()
        from corral import images
    try:
        build_images(runtime)
    except CorralError as exc:
        raise common.fail(str(exc)) from None
    common.console.print(f"[green]built {images.DESKTOP_IMAGE} and {images.EGRESS_IMAGE}[/green]")
