"""``corral exec``: the command's output streamed to stdout and stderr as it comes, its exit code this
one's, a timeout 124, over a fake session WebSocket (``common.sandbox_client``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from typer.testing import CliRunner
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from corral.cli import app, common
from corral.errors import error_body


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _event(stream: str, data: bytes) -> dict[str, Any]:
    return {"id": 1, "event": "output", "stream": stream, "data": _b64(data), "encoding": "base64"}


def _reply(**result: Any) -> dict[str, Any]:
    ended = {"exit_code": 0, "signal": None, "timed_out": False, "stdout": "", "stderr": "", "encoding": "base64"}
    return {"ok": True, "id": 1, "result": {**ended, **result}}


class FakeSession:
    """The session's WebSocket: answers a streamed request with ``frames``; keeps what it was sent."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.frames = frames
        self.sent: list[dict[str, Any]] = []
        self.opened: list[str] = []

    def __call__(self, session_id: str) -> Self:
        self.opened.append(session_id)
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self.sent.append(payload)
        yield from self.frames


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")

    def install(frames: list[dict[str, Any]]) -> FakeSession:
        fake = FakeSession(frames)
        monkeypatch.setattr(common, "sandbox_client", fake)
        return fake

    return install


def test_argv_after_the_dashes_runs_and_its_streams_and_exit_code_come_back(session: Any) -> None:
    fake = session(
        [_event("stdout", b"out \xff\n"), _event("stderr", b"warn\n"), _reply(exit_code=3, stdout=_b64(b"out"))]
    )
    result = CliRunner().invoke(app, ["exec", "ses_1", "--cwd", "/w", "-e", "A=1", "--", "ls", "-la", "--sh"])
    assert result.exit_code == 3
    assert result.stdout_bytes == b"out \xff\n"  # bytes as printed, once (not again from the reply)
    assert result.stderr_bytes == b"warn\n"
    assert fake.opened == ["ses_1"]
    assert fake.sent == [
        {
            "action": {
                "type": "exec",
                "argv": ["ls", "-la", "--sh"],
                "cwd": "/w",
                "env": {"A": "1"},
                "max_output_bytes": 0,
                "output_encoding": "base64",
                "stream": True,
            }
        }
    ]


def test_a_shell_string_a_timeout_and_stdin(session: Any, tmp_path: Path) -> None:
    fake = session([_reply(exit_code=None, signal="SIGKILL", timed_out=True)])
    (tmp_path / "in").write_bytes(b"\x00input")
    args = ["exec", "ses_1", "--sh", "sleep 9 | cat", "--timeout", "0.5", "--stdin", str(tmp_path / "in")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 124
    assert "timed out" in result.stderr
    action = fake.sent[0]["action"]
    assert (action["command"], action["timeout_ms"], action["stdin_base64"]) == (
        "sleep 9 | cat",
        500,
        _b64(b"\x00input"),
    )
    assert "argv" not in action


def test_output_only_in_the_reply_is_printed_and_a_signal_is_128_plus(session: Any) -> None:
    session([_reply(exit_code=None, signal="SIGTERM", stdout=_b64(b"late"), stderr=_b64(b"err"))])
    result = CliRunner().invoke(app, ["exec", "ses_1", "--", "true"])
    assert (result.exit_code, result.stdout_bytes, result.stderr_bytes[:3]) == (143, b"late", b"err")


@pytest.mark.parametrize(
    ("code", "status"), [("program_not_found", 127), ("permission_denied", 126), ("invalid_field", 1)]
)
def test_a_command_that_cannot_start_exits_as_a_shell_would(session: Any, code: str, status: int) -> None:
    session([{**error_body(code, "no such program: 'nope'", "action.argv"), "id": 1}])
    result = CliRunner().invoke(app, ["exec", "ses_1", "--", "nope"])
    assert result.exit_code == status
    assert code in result.stderr


@pytest.mark.parametrize("args", [["exec", "ses_1"], ["exec", "ses_1", "--sh", "ls", "--", "ls"]])
def test_exactly_one_of_argv_and_sh(session: Any, args: list[str]) -> None:
    fake = session([_reply()])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and fake.sent == []


def test_the_websocket_goes_to_the_gateway_with_the_key_in_a_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_API_KEY", "key-1")
    monkeypatch.setenv("CORRAL_URL", "https://gateway.test:8700/")
    client = common.sandbox_client("ses_1")
    assert client._url == "wss://gateway.test:8700/v1/sessions/ses_1/ws"
    assert client._headers == {"Authorization": "Bearer key-1"}
    assert json.dumps(client._headers).count("key-1") == 1 and "key-1" not in client._url


def test_a_session_the_gateway_refuses_is_a_clean_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refused(FakeSession):
        def stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
            raise ConnectionClosed(Close(4404, "no session ses_9"), None)
            yield {}

    monkeypatch.setenv("CORRAL_API_KEY", "key-1")
    monkeypatch.setattr(common, "sandbox_client", Refused([]))
    result = CliRunner().invoke(app, ["exec", "ses_9", "--", "true"])
    assert result.exit_code == 1
    assert "no session ses_9" in result.stderr and "Traceback" not in result.output
