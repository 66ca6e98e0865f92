"""The ``corral`` command line: run the gateway, manage sessions, send actions, build images.

Assembled here from one module per command group (their rows in ARCHITECTURE.md); what they share
is :mod:`corral.cli.common`. The commands that need an extra (the gateway's Docker, the MCP SDK,
ffmpeg) import it when they run, so a client install (no extras) runs the rest."""

from __future__ import annotations

import typer

from corral.cli import actions, code, files, lifecycle, mcp, recordings
from corral.cli.audit import audit_app
from corral.cli.downloads import downloads_app
from corral.cli.images import images_app
from corral.cli.previews import preview_app
from corral.cli.profiles import profile_app
from corral.cli.recordings import export_app, recording_app
from corral.cli.sessions import session_app
from corral.cli.templates import template_app
from corral.cli.volumes import volume_app

app = typer.Typer(
    help="Corral: disposable desktops with Chromium for computer-use agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
# In the order `corral --help` has always listed them: the commands, then the groups.
app.command()(lifecycle.up)
app.command()(lifecycle.down)
app.command()(lifecycle.status)
app.command("mcp")(mcp.mcp_stdio)
app.command("do")(actions.do)
app.command()(actions.screenshot)
app.command("exec")(actions.exec_command)
app.command("run-code")(code.run_code)
app.command("cp")(files.cp)
app.command()(recordings.replay)
app.add_typer(images_app, name="images")
app.add_typer(session_app, name="session")
app.add_typer(volume_app, name="volume")
app.add_typer(template_app, name="template")
app.add_typer(audit_app, name="audit")
app.add_typer(recording_app, name="recording")
app.add_typer(export_app, name="export")
app.add_typer(profile_app, name="profile")
app.add_typer(code.code_app, name="code")
app.add_typer(preview_app, name="preview")
app.add_typer(downloads_app, name="downloads")


def main() -> None:
    app()


__all__ = ["app", "main"]
