"""What a recorded event keeps of the bytes commands and file operations carry."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from corral.recording.redact import INPUT_PREFIX_BYTES, digest, prefix, redact


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _event(action: dict[str, Any], result: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "action_id": "a1.beef",
        "request": {"id": 1, "action": action},
        "native": [action],
        "ok": True,
        "reply": {"ok": True, "id": 1, "result": result or {}},
    }


def test_a_file_write_keeps_a_prefix_and_the_size_and_sha256_of_what_was_uploaded() -> None:
    content = "x" * 5000
    event = _event(
        {"type": "file_write", "path": "/workspace/a.txt", "content": content},
        {"path": "/workspace/a.txt", "size": 5000, "sha256": _sha(content.encode())},
    )
    out = redact(event)
    assert out["request"]["action"]["content"] == "x" * INPUT_PREFIX_BYTES
    assert out["native"][0]["content"] == "x" * INPUT_PREFIX_BYTES
    assert out["payloads"]["request.action.content"] == {
        "size": 5000,
        "sha256": _sha(content.encode()),
        "truncated": True,
    }
    assert out["payloads"]["native.0.content"]["truncated"] is True
    assert out["request"]["action"]["path"] == "/workspace/a.txt"
    assert out["reply"]["result"] == event["reply"]["result"]  # path, size and sha256 kept as they were
    assert content not in json.dumps(out)
    assert event["request"]["action"]["content"] == content  # the event given is left as it was


def test_base64_uploads_are_digested_decoded_and_cut_on_a_quad() -> None:
    data = bytes(range(256)) * 40
    encoded = base64.b64encode(data).decode()
    out = redact(_event({"type": "file_write", "path": "b.bin", "content_base64": encoded}))
    kept = out["request"]["action"]["content_base64"]
    assert len(kept) % 4 == 0 and len(kept) <= INPUT_PREFIX_BYTES
    assert base64.b64decode(kept) == data[: len(kept) // 4 * 3]
    assert out["payloads"]["request.action.content_base64"] == {
        "size": len(data),
        "sha256": _sha(data),
        "truncated": True,
    }


def test_a_small_upload_stays_whole_so_the_step_replays() -> None:
    out = redact(_event({"type": "file_write", "path": "s.txt", "content": "hello\n"}))
    assert out["request"]["action"]["content"] == "hello\n"
    assert out["payloads"]["request.action.content"] == {"size": 6, "sha256": _sha(b"hello\n"), "truncated": False}


def test_process_write_data_and_exec_stdin_are_uploads_too() -> None:
    secret = "s" * 3000
    written = redact(_event({"type": "process_write", "pid": 7, "data": secret}))
    assert written["request"]["action"]["data"] == "s" * INPUT_PREFIX_BYTES
    assert written["request"]["action"]["pid"] == 7
    stdin = redact(_event({"type": "exec", "argv": ["cat"], "stdin_base64": base64.b64encode(b"\0" * 4000).decode()}))
    assert stdin["payloads"]["native.0.stdin_base64"]["size"] == 4000
    assert stdin["native"][0]["argv"] == ["cat"]


def test_exec_outputs_share_the_budget_and_the_command_and_exit_code_stay() -> None:
    action = {"type": "exec", "command": "make", "cwd": "/workspace"}
    result = {
        "pid": 12,
        "exit_code": 2,
        "signal": None,
        "stdout": "o" * 100_000,
        "stderr": "short error\n",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "timed_out": False,
        "duration_ms": 812.5,
        "encoding": "utf-8",
    }
    out = redact(_event(action, result), output_budget=1000)
    got = out["reply"]["result"]
    assert got["stderr"] == "short error\n"  # the short one whole, the long one gets the rest
    assert got["stdout"] == "o" * (1000 - len("short error\n"))
    assert out["payloads"]["reply.result.stdout"] == {
        "size": 100_000,
        "sha256": _sha(b"o" * 100_000),
        "truncated": True,
    }
    assert out["payloads"]["reply.result.stderr"]["truncated"] is False
    assert (got["exit_code"], got["duration_ms"], got["stdout_truncated"]) == (2, 812.5, False)
    assert out["request"]["action"] == action


def test_base64_output_and_file_read_content_and_process_output_data() -> None:
    data = b"\x89PNG" + bytes(5000)
    encoded = base64.b64encode(data).decode()
    read = redact(
        _event({"type": "file_read", "path": "i.png"}, {"path": "i.png", "content": encoded, "encoding": "base64"}),
        output_budget=100,
    )
    assert read["reply"]["result"]["content"] == encoded[:100]
    assert read["payloads"]["reply.result.content"] == {"size": len(data), "sha256": _sha(data), "truncated": True}
    output = redact(
        _event({"type": "process_output", "pid": 3, "stream": "stdout"}, {"pid": 3, "data": "é" * 100}),
        output_budget=51,
    )
    assert output["reply"]["result"]["data"] == "é" * 25  # whole characters only
    assert output["payloads"]["reply.result.data"]["size"] == 200


def test_redacting_again_keeps_the_first_digests_and_only_cuts_further() -> None:
    stdout = "line\n" * 10_000
    first = redact(_event({"type": "exec", "command": "yes line"}, {"stdout": stdout, "stderr": ""}), 4000)
    second = redact(first, output_budget=400)
    assert second["payloads"]["reply.result.stdout"]["sha256"] == _sha(stdout.encode())
    assert second["payloads"]["reply.result.stdout"]["size"] == len(stdout)
    assert len(second["reply"]["result"]["stdout"]) == 400
    assert redact(second, output_budget=400) == second


def test_other_events_are_returned_as_they_are() -> None:
    click = _event({"type": "click", "x": 1, "y": 2}, {"x": 1, "y": 2})
    assert redact(click) is click
    failed = {"request": "{not json", "native": None, "ok": False, "reply": {"ok": False, "error": {"code": "x"}}}
    assert redact(failed) is failed


def test_a_refused_file_write_is_redacted_from_its_request_alone() -> None:
    # Refused before it was planned: no native form, an error reply; the request still holds the bytes.
    event = {
        "request": {"id": 2, "action": {"type": "file_write", "path": "a\x00b", "content": "z" * 4096}},
        "native": None,
        "ok": False,
        "reply": {"ok": False, "id": 2, "error": {"code": "invalid_field", "field": "action.path"}},
    }
    out = redact(event)
    assert len(out["request"]["action"]["content"]) == INPUT_PREFIX_BYTES
    assert list(out["payloads"]) == ["request.action.content"]


def test_digest_and_prefix() -> None:
    assert digest("aGk=", True) == (2, _sha(b"hi"))
    assert digest("not base64!", True) == (11, _sha(b"not base64!"))  # digested as sent
    assert prefix("aGVsbG8gd29ybGQ=", 7, True) == "aGVs"
    assert prefix("日本語", 5, False) == "日"


def test_exec_env_keeps_its_names_and_never_its_values() -> None:
    action = {"type": "exec", "command": "deploy", "env": {"API_TOKEN": "s3cr3t-value", "DEBUG": "1"}}
    event = _event(action, {"exit_code": 0, "stdout": "", "stderr": ""})
    out = redact(event)
    for env in (out["request"]["action"]["env"], out["native"][0]["env"]):
        assert env == {
            "API_TOKEN": {"size": 12, "sha256": _sha(b"s3cr3t-value")},
            "DEBUG": {"size": 1, "sha256": _sha(b"1")},
        }
    assert "s3cr3t-value" not in json.dumps(out)
    assert out["request"]["action"]["command"] == "deploy"
    assert event["request"]["action"]["env"]["API_TOKEN"] == "s3cr3t-value"  # the event given is left as it was
    assert redact(out) == out  # a second pass (the gateway's) keeps the digests


def test_a_refused_exec_has_its_env_hidden_too_whatever_its_shape() -> None:
    odd = {"type": "exec", "command": "x", "env": {"TOKEN": 12345, "BAD NAME": "hunter2"}}
    refused = {"request": {"id": 3, "action": odd}, "native": None, "ok": False, "reply": {"ok": False}}
    out = redact(refused)
    assert out["request"]["action"]["env"] == {
        "TOKEN": {"size": 5, "sha256": _sha(b"12345")},
        "BAD NAME": {"size": 7, "sha256": _sha(b"hunter2")},
    }
    whole = redact({**refused, "request": {"action": {"type": "exec", "command": "x", "env": "TOKEN=hunter2"}}})
    assert whole["request"]["action"]["env"] == {"size": 13, "sha256": _sha(b"TOKEN=hunter2")}
    assert "hunter2" not in json.dumps([out, whole])
