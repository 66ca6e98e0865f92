"""corral.env as the client commands read it: the gateway's port and key, where the shell sets
neither; nothing from a file `corral up` would refuse."""

from __future__ import annotations

from pathlib import Path

from corral import envlines


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / envlines.DEFAULT_NAME
    path.write_text(text)
    return path


def test_the_client_takes_the_port_and_key_the_file_sets(tmp_path: Path) -> None:
    _file(tmp_path, "# the gateway\nCORRAL_PORT=8711\nCORRAL_API_KEY='k-9f3a'\nCORRAL_EGRESS=1\n")
    environ: dict[str, str] = {}
    envlines.take_client_settings(tmp_path, environ)
    assert environ == {"CORRAL_PORT": "8711", "CORRAL_API_KEY": "k-9f3a"}


def test_the_shell_wins_over_the_file(tmp_path: Path) -> None:
    _file(tmp_path, "CORRAL_PORT=8711\nCORRAL_API_KEY=from-file\n")
    environ = {"CORRAL_API_KEY": "from-shell"}
    envlines.take_client_settings(tmp_path, environ)
    assert environ == {"CORRAL_API_KEY": "from-shell", "CORRAL_PORT": "8711"}


def test_a_broken_file_gives_nothing(tmp_path: Path) -> None:
    _file(tmp_path, "CORRAL_PORT=8711\nCORRAL_API_KEY='unclosed\n")
    environ: dict[str, str] = {}
    envlines.take_client_settings(tmp_path, environ)
    assert environ == {}


def test_no_checkout_or_no_file_gives_nothing(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    envlines.take_client_settings(None, environ)
    envlines.take_client_settings(tmp_path, environ)
    assert environ == {}


def test_the_checkout_is_found_from_the_package_itself() -> None:
    assert envlines.checkout_root() == Path(__file__).resolve().parents[2]
