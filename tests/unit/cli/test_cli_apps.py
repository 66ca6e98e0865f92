"""The command line's Typer apps: a crash never prints a frame's locals (a secrets file's values)."""

from __future__ import annotations

import typer

from corral import cli


def test_no_app_shows_locals_in_a_traceback() -> None:
    apps = [value for value in vars(cli).values() if isinstance(value, typer.Typer)]
    assert len(apps) >= 6
    assert all(app.pretty_exceptions_show_locals is False for app in apps)
