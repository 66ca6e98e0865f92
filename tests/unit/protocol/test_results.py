"""Each action's result model (corral.protocol.results) holds exactly what the sandbox sends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from corral.protocol import results as r
from corral.protocol.actions import ACTIONS

_LEASE = {"holder": "agent", "since": 1.5, "help": None, "handed_back": None}
_STATUS = {"pid": 7, "exit_code": 0, "signal": None, "oom_killed": False, "duration_ms": 12.34}

# One result per shape, as the sandbox's action modules build them (key order included).
SENT: dict[str, list[dict[str, Any]]] = {
    "screenshot": [{}],
    "zoom": [{}],
    "click": [{"x": 10, "y": 20}],
    "mouse_down": [{"x": 0, "y": 0}],
    "mouse_up": [{"x": 1, "y": 2}],
    "move": [{"x": 3, "y": 4}],
    "drag": [{"x": 5, "y": 6}],
    "scroll": [
        {"clicks": 3, "direction": "down"},
        {"dx": 0, "dy": 120, "via": "cdp"},
        {"dx": 5, "dy": 0, "via": "wheel"},
    ],
    "type": [{"typed": 5, "via": "x"}, {"typed": 1, "via": "cdp"}],
    "key": [{}],
    "wait": [{}],
    "cursor_position": [{"x": 7, "y": 8}],
    "clipboard_get": [{"text": "héllo"}],
    "clipboard_set": [{}],
    "navigate": [
        {"url": "http://site.test/", "title": "Site", "status": 200},
        {"url": "http://site.test/#a", "title": "", "status": None},
    ],
    "back": [{"url": "about:blank", "title": ""}],
    "forward": [{"url": "http://site.test/", "title": "Site"}],
    "reload": [{"url": "http://site.test/", "title": "Site"}],
    "page_info": [{"url": "http://site.test/", "title": "Site"}],
    "tabs": [{"tabs": [{"index": 0, "id": "t1", "active": True, "url": "about:blank", "title": ""}]}, {"tabs": []}],
    "tab_new": [{"id": "t2", "url": "http://site.test/", "title": "Site"}],
    "tab_switch": [{"id": "t1", "url": "about:blank", "title": ""}],
    "tab_close": [{"closed": "t2", "tabs": 1}],
    "file_read": [
        {
            "path": "/workspace/a.txt",
            "content": "hi",
            "encoding": "utf-8",
            "size": 2,
            "offset": 0,
            "length": 2,
            "eof": True,
        },
        {
            "path": "/workspace/\ufffd",
            "path_base64": "L3dvcmtzcGFjZS//",
            "content": "aGk=",
            "encoding": "base64",
            "size": 2,
            "offset": 0,
            "length": 2,
            "eof": True,
        },
    ],
    "file_write": [{"path": "/workspace/a.txt", "size": 2, "sha256": "ab" * 32}],
    "file_list": [
        {
            "path": "/workspace",
            "entries": [
                {
                    "path": "/workspace/a",
                    "name": "a",
                    "type": "file",
                    "size": 2,
                    "mode": "0644",
                    "mtime": 1700000000.25,
                },
                {
                    "path": "/workspace/l",
                    "name": "l",
                    "type": "symlink",
                    "size": 1,
                    "mode": "0777",
                    "mtime": 1700000000.0,
                    "target": "a",
                },
            ],
            "truncated": False,
        }
    ],
    "file_stat": [
        {
            "path": "/workspace/\ufffd",
            "path_base64": "L3dvcmtzcGFjZS//",
            "name": "\ufffd",
            "name_base64": "/w==",
            "type": "directory",
            "size": 40,
            "mode": "0755",
            "mtime": 1.0,
        }
    ],
    "file_remove": [{"path": "/workspace/a", "type": "file"}],
    "file_move": [{"source": "/workspace/a", "destination": "/workspace/b"}],
    "exec": [
        {
            **_STATUS,
            "stdout": "out\n",
            "stdout_truncated": False,
            "stderr": "",
            "stderr_truncated": False,
            "timed_out": False,
            "encoding": "utf-8",
        },
        {
            **_STATUS,
            "exit_code": None,
            "signal": "SIGKILL",
            "oom_killed": None,
            "stdout": "",
            "stdout_truncated": True,
            "stderr": "",
            "stderr_truncated": False,
            "timed_out": True,
            "encoding": "base64",
        },
        {"pid": 9, "background": True},
    ],
    "process_list": [
        {
            "processes": [
                {
                    "pid": 9,
                    "command": None,
                    "argv": ["sleep", "9"],
                    "cwd": "/workspace",
                    "pty": False,
                    "background": True,
                    "started": 1700000000.123,
                    "running": True,
                    "exit_code": None,
                    "signal": None,
                    "action_id": "a1.ffff",
                }
            ]
        }
    ],
    "process_wait": [{**_STATUS, "timed_out": False, "running": False}],
    "process_kill": [{"pid": 9, "signal": "SIGTERM"}],
    "process_write": [{"pid": 9, "written": 3}],
    "process_output": [
        {
            "pid": 9,
            "stream": "stdout",
            "data": "x",
            "encoding": "utf-8",
            "offset": 0,
            "next_offset": 1,
            "dropped": 0,
            "running": True,
            "exit_code": None,
        }
    ],
    "process_resize": [{"pid": 9, "rows": 40, "cols": 100}],
    "shell": [
        {"output": "hi\n", "exit_code": 0, "truncated": False, "restarted": False},
        {"output": "tool has been restarted.", "exit_code": None, "truncated": False, "restarted": True},
    ],
    "edit": [{"output": "File created successfully at: /workspace/a", "path": "/workspace/a"}],
    "apply_patch": [{"output": "Updated /workspace/a", "path": "/workspace/a"}],
    "file_glob": [{"paths": ["/workspace/a.py"], "truncated": False}],
    "file_grep": [{"matches": [{"path": "/workspace/a.py", "line": 3, "text": "import os"}], "truncated": True}],
    "secrets": [{"secrets": {"TOKEN": "corral-placeholder-abc"}}, {"secrets": {}}],
    "run_code": [
        {
            "context": "default",
            "language": "python",
            "results": [
                {
                    "data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="},
                    "is_main_result": False,
                    "omitted": [],
                },
                {"data": {"text/plain": "2"}, "is_main_result": True, "omitted": ["application/vnd.custom+json"]},
            ],
            "logs": {"stdout": ["hi\n"], "stderr": [], "truncated": False},
            "error": None,
            "execution_count": 3,
            "timed_out": False,
            "state_lost": False,
            "duration_ms": 12.5,
        },
        {
            "context": "data",
            "language": "python",
            "results": [],
            "logs": {"stdout": [], "stderr": [], "truncated": True},
            "error": {"name": "KernelDied", "value": "the kernel was killed by SIGKILL", "traceback": ""},
            "execution_count": None,
            "timed_out": False,
            "state_lost": True,
            "duration_ms": 3.0,
        },
    ],
    "list_code_contexts": [
        {
            "contexts": [
                {
                    "name": "default",
                    "language": "python",
                    "state": "idle",
                    "pid": 41,
                    "execution_count": 2,
                    "started": 1700000000.5,
                }
            ]
        },
        {"contexts": []},
    ],
    "restart_code_context": [
        {"name": "default", "language": "python", "state": "idle", "pid": 42, "execution_count": 0, "started": 1.5}
    ],
    "remove_code_context": [{"name": "default", "removed": True}, {"name": "x", "removed": False}],
    "control": [
        _LEASE,
        {
            "holder": "human:ann",
            "since": 2.0,
            "help": {"reason": "log in", "at": 1.75},
            "handed_back": {"by": "human:ann", "note": "done", "at": 3.0, "left": False},
        },
    ],
    "request_control": [{**_LEASE, "handed_back": {"by": "human:ann", "note": None, "at": 3.0, "left": True}}],
}


def test_every_action_names_its_result_model() -> None:
    assert set(SENT) == set(ACTIONS)
    for model in ACTIONS.values():
        assert hasattr(model.result, "wire"), model


@pytest.mark.parametrize(("action_type", "sent"), [(t, s) for t, shapes in SENT.items() for s in shapes])
def test_the_model_reads_what_is_sent_and_gives_back_the_same_bytes(action_type: str, sent: dict[str, Any]) -> None:
    result = ACTIONS[action_type].result.model_validate(sent)
    assert json.dumps(result.wire()) == json.dumps(sent)  # same keys, same order, same omissions


@pytest.mark.parametrize("action_type", list(ACTIONS))
def test_a_key_the_sandbox_does_not_send_is_refused(action_type: str) -> None:
    sent = {**SENT[action_type][0], "surprise": 1}
    with pytest.raises(ValidationError):
        ACTIONS[action_type].result.model_validate(sent)


def test_a_step_failure_omits_what_its_error_lacks() -> None:
    failed = r.StepFailed(error=r.ErrorBody(code="timeout", message="too slow"))
    assert failed.wire() == {"error": {"code": "timeout", "message": "too slow"}}
    held = {"code": "lease_held", "message": "a human", "field": "action", "holder": "human:ann", "since": 1.0}
    assert r.StepFailed.model_validate({"error": held}).wire() == {"error": held}


def test_results_are_frozen() -> None:
    position = r.Position(x=1, y=2)
    with pytest.raises(ValidationError):
        position.x = 3  # type: ignore[misc]


def _documented_replies() -> list[tuple[str, dict[str, Any]]]:
    """(action type, its reply's result) of each native request in docs/protocol.md followed by its
    successful reply, on the next line of the example."""
    docs = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
    found: list[tuple[str, dict[str, Any]]] = []
    asked: dict[str, Any] | None = None
    for line in docs.read_text().splitlines():
        try:
            message = json.loads(line) if line.startswith("{") else None
        except ValueError:
            message = None
        if isinstance(message, dict) and asked is not None and message.get("ok") is True and "result" in message:
            found.append((asked["type"], message["result"]))
        action = message.get("action") if isinstance(message, dict) else None
        asked = action if isinstance(action, dict) else None
    return found


def test_the_documented_replies_are_what_the_models_read_and_give_back() -> None:
    documented = _documented_replies()
    assert len(documented) >= 8
    for action_type, result in documented:
        assert ACTIONS[action_type].result.model_validate(result).wire() == result, action_type
