"""OpenAI's tools verbatim through the real gateway and a real sandbox: ``{"openai": <output item>}``
in, the complete input item to send back out (held to the SDK's ``ComputerCallOutput``,
``ShellCallOutput``, ``LocalShellCallOutput`` and ``ApplyPatchCallOutput``), success and every error
path: ``computer_call``, ``shell_call``, ``local_shell_call`` and ``apply_patch_call`` on one session."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sdk import Sandbox

from .conftest import await_json, await_title, center, find_color, open_page, screenshot_image
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway
from .test_input import BUTTON_JS, BUTTON_PAGE
from .vendor_fixtures import (
    BLUE,
    INPUT_JS,
    INPUT_PAGE,
    RED,
    SCREEN,
    apply_patch_call,
    cat,
    computer_call,
    item,
    local_shell_call,
    over_http,
    screenshot_of,
    shell_call,
)

pytestmark = pytest.mark.usefixtures("desktop_image")

SAFETY = [{"id": "cu_sc_1", "code": "malicious_instructions", "message": "The page asks to ignore instructions."}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-vendor-o", egress=False) as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sandbox:
        yield sandbox


def run(sb: Sandbox, call: dict[str, Any], *, ok: bool = True, **envelope: Any) -> dict[str, Any]:
    """One output item over the WebSocket; its checked output item."""
    return item(sb.request({"openai": call, **envelope}), call, ok=ok)


def failed(sb: Sandbox, call: dict[str, Any], code: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call that must fail with ``code``: the reply and its checked output item."""
    reply = sb.request({"openai": call})
    out = item(reply, call, ok=False)
    assert reply["error"]["code"] == code, reply["error"]
    return reply, out


def exists(sb: Sandbox, path: str) -> bool:
    return sb.exec(argv=["test", "-e", path]).exit_code == 0


# -- computer_call ---------------------------------------------------------------------------------------


def test_a_computer_call_with_actions_and_its_screenshot(sb: Sandbox) -> None:
    open_page(sb, INPUT_PAGE, INPUT_JS)
    x, y = center(find_color(screenshot_image(sb), BLUE))
    call = computer_call(
        {"type": "click", "button": "left", "x": x, "y": y},
        {"type": "type", "text": "from a computer_call"},
        {"type": "keypress", "keys": ["CTRL", "A"]},
        {"type": "keypress", "keys": ["BACKSPACE"]},
        {"type": "type", "text": "done"},
    )
    out = run(sb, call)
    assert set(out) == {"type", "call_id", "output"}, out
    assert await_title(sb, "done") == "done"
    assert screenshot_of(out).size == SCREEN


def test_keys_are_held_on_pointer_actions(sb: Sandbox) -> None:
    open_page(sb, BUTTON_PAGE, BUTTON_JS)
    x, y = center(find_color(screenshot_image(sb), RED))
    run(sb, computer_call({"type": "click", "button": "left", "x": x, "y": y, "keys": ["SHIFT"]}))
    state = await_json(sb, lambda s: s["n"] == 1)
    assert state["shift"] is True and state["ctrl"] is False
    open_page(sb, BUTTON_PAGE, BUTTON_JS)  # a fresh page: no click count carried over from the click
    run(sb, computer_call({"type": "double_click", "x": x, "y": y, "keys": ["CTRL"]}))
    state = await_json(sb, lambda s: s["n"] == 2)
    assert state["ctrl"] is True and state["detail"] == 2


def test_pending_safety_checks_are_acknowledged_only_when_the_caller_says_so(sb: Sandbox) -> None:
    call = computer_call({"type": "screenshot"}, pending=SAFETY)
    out = run(sb, call, acknowledge_safety_checks=True)
    assert set(out) == {"type", "call_id", "output", "acknowledged_safety_checks"}, out
    assert out["acknowledged_safety_checks"] == SAFETY
    out = run(sb, computer_call({"type": "wait"}, pending=SAFETY))  # still run, nothing acknowledged
    assert set(out) == {"type", "call_id", "output"}, out


def test_a_failed_computer_call_still_carries_a_screenshot(sb: Sandbox) -> None:
    call = computer_call({"type": "click", "button": "left", "x": 99_999, "y": 1})
    reply = sb.request({"openai": call})
    assert reply["ok"] is False and reply["error"]["code"] == "out_of_bounds", reply
    out = item(reply, call, ok=False)
    assert screenshot_of(out).size == SCREEN
    run(sb, computer_call({"type": "screenshot"}))


# -- shell_call ------------------------------------------------------------------------------------------


def test_a_shell_call_runs_each_command_in_order(sb: Sandbox) -> None:
    call = shell_call("echo one", "echo two >&2; exit 3", "pwd; id -un", "cd /tmp")
    out = run(sb, call)
    assert set(out) == {"type", "call_id", "output"} or set(out) == {"type", "call_id", "output", "status"}, out
    first, second, third, fourth = out["output"]
    assert (first["stdout"], first["stderr"], first["outcome"]) == ("one\n", "", {"type": "exit", "exit_code": 0})
    assert (second["stdout"], second["stderr"], second["outcome"]) == ("", "two\n", {"type": "exit", "exit_code": 3})
    assert third["stdout"] == "/workspace\nagent\n"
    assert fourth["outcome"] == {"type": "exit", "exit_code": 0}
    # Each command is its own bash: the cd did not stick.
    assert run(sb, shell_call("pwd"))["output"][0]["stdout"] == "/workspace\n"


def test_max_output_length_cuts_each_entry_and_is_echoed(sb: Sandbox) -> None:
    out = run(sb, shell_call("printf %0100d 0; printf %050d 0 >&2", "echo short", max_output_length=30))
    assert out["max_output_length"] == 30, out
    cut, short = out["output"]
    assert len(cut["stdout"]) + len(cut["stderr"]) <= 30 and cut["stdout"].startswith("0000")
    assert short["stdout"] == "short\n"


def test_a_shell_call_over_its_timeout(sb: Sandbox, runtime: DockerHarness) -> None:
    call = shell_call("echo quick", "echo started; sleep 600", "touch /workspace/never-run", timeout_ms=1500)
    started = time.monotonic()
    _, out = failed(sb, call, "timeout")
    assert time.monotonic() - started < 30
    quick, slow, after = out["output"]
    assert quick["outcome"] == {"type": "exit", "exit_code": 0} and quick["stdout"] == "quick\n"
    assert slow["outcome"] == {"type": "timeout"} and after["outcome"] == {"type": "timeout"}
    assert not exists(sb, "/workspace/never-run")
    code, listed = runtime.exec(sb.container, ["pgrep", "-f", "sleep 600"], user="root")
    assert code == 1, listed
    assert run(sb, shell_call("echo next"))["output"][0]["stdout"] == "next\n"


# -- local_shell_call ------------------------------------------------------------------------------------


def _local_output(out: dict[str, Any]) -> dict[str, Any]:
    assert set(out) <= {"type", "id", "output", "status"}, out
    parsed: dict[str, Any] = json.loads(out["output"])
    return parsed


def test_a_local_shell_call_with_env_and_working_directory(sb: Sandbox) -> None:
    call = local_shell_call(
        ["bash", "-c", "echo $GREETING; pwd; id -un; echo err >&2"],
        env={"GREETING": "hello local"},
        working_directory="/tmp",
        timeout_ms=10_000,
    )
    parsed = _local_output(run(sb, call))
    assert parsed["output"].split("\n")[:3] == ["hello local", "/tmp", "agent"] and "err" in parsed["output"]
    assert parsed["metadata"]["exit_code"] == 0 and isinstance(parsed["metadata"]["duration_seconds"], int | float)
    exited = _local_output(run(sb, local_shell_call(["sh", "-c", "exit 4"])))
    assert exited["metadata"]["exit_code"] == 4
    as_agent = _local_output(run(sb, local_shell_call(["id", "-u"], user="agent")))
    assert as_agent["output"].strip() == "1100"


def test_a_local_shell_call_over_its_timeout(sb: Sandbox) -> None:
    call = local_shell_call(["sh", "-c", "echo started; sleep 600"], timeout_ms=1000)
    started = time.monotonic()
    reply = sb.request({"openai": call})
    out = item(reply, call, ok=reply["ok"])
    assert time.monotonic() - started < 30
    assert "started" in out["output"] and (not reply["ok"] or "timeout" in json.loads(out["output"])["output"]), reply
    assert not reply["ok"] or json.loads(out["output"])["metadata"]["exit_code"] != 0, reply
    assert sb.exec("pgrep -f 'sleep 600'").exit_code == 1
    run(sb, local_shell_call(["true"]))


def test_a_local_shell_call_that_cannot_start(sb: Sandbox) -> None:
    reply, out = failed(sb, local_shell_call(["no-such-program-here"]), "program_not_found")
    assert reply["error"]["message"] in out["output"]
    run(sb, local_shell_call(["true"]))


# -- apply_patch_call ------------------------------------------------------------------------------------

PLAN = "alpha\nbeta\ngamma\n"
UPDATE = "@@\n alpha\n-beta\n+BETA\n gamma\n"


def test_apply_patch_create_update_delete(sb: Sandbox) -> None:
    made = run(sb, apply_patch_call("create_file", "patched/plan.txt", "+alpha\n+beta\n+gamma\n"))
    assert made["status"] == "completed" and made["output"], made
    assert set(made) <= {"type", "call_id", "status", "output"}
    assert cat(sb, "/workspace/patched/plan.txt") == PLAN
    updated = run(sb, apply_patch_call("update_file", "/workspace/patched/plan.txt", UPDATE))
    assert updated["status"] == "completed"
    assert cat(sb, "/workspace/patched/plan.txt") == "alpha\nBETA\ngamma\n"
    removed = run(sb, apply_patch_call("delete_file", "patched/plan.txt"))
    assert removed["status"] == "completed" and not exists(sb, "/workspace/patched/plan.txt")


def test_apply_patch_failures_change_nothing(sb: Sandbox) -> None:
    sb.files.write("/workspace/kept.txt", PLAN)
    stale = "@@\n alpha\n-delta\n+DELTA\n gamma\n"
    reply, out = failed(sb, apply_patch_call("update_file", "kept.txt", stale), "patch_failed")
    assert out["status"] == "failed" and out["output"] == reply["error"]["message"], out
    assert "delta" in out["output"]  # names the context that was not found
    assert cat(sb, "/workspace/kept.txt") == PLAN
    # Two hunks, the second stale: never a partial edit.
    half = "@@\n alpha\n-beta\n+BETA\n@@\n gamma\n-epsilon\n+EPSILON\n"
    failed(sb, apply_patch_call("update_file", "kept.txt", half), "patch_failed")
    assert cat(sb, "/workspace/kept.txt") == PLAN
    # create_file over a file replaces it, as codex's *** Add File: and agents-python do.
    replaced = run(sb, apply_patch_call("create_file", "kept.txt", "+new\n"))
    assert replaced["output"] == "Created /workspace/kept.txt (it replaced the file that was there)", replaced
    assert cat(sb, "/workspace/kept.txt") == "new\n"
    sb.files.write("/workspace/kept.txt", PLAN)
    _, missing = failed(sb, apply_patch_call("update_file", "absent.txt", UPDATE), "no_such_file")
    assert missing["status"] == "failed"
    failed(sb, apply_patch_call("delete_file", "absent.txt"), "no_such_file")
    assert run(sb, apply_patch_call("update_file", "kept.txt", UPDATE))["status"] == "completed"


# -- bad input -------------------------------------------------------------------------------------------


def _still_works(sb: Sandbox) -> None:
    assert run(sb, shell_call("echo still-here"))["output"][0]["stdout"] == "still-here\n"


def test_a_call_without_a_call_id_gets_only_the_error(sb: Sandbox) -> None:
    call = shell_call("touch /workspace/no-call-id")
    del call["call_id"]
    reply = sb.request({"openai": call})
    assert reply["ok"] is False and "result" not in reply, reply
    assert (reply["error"]["code"], reply["error"]["field"]) == ("missing_field", "openai.call_id"), reply["error"]
    assert not exists(sb, "/workspace/no-call-id")
    _still_works(sb)


def test_a_call_with_a_bad_action_gets_its_error_form(sb: Sandbox) -> None:
    call = shell_call("true")
    call["action"] = "ls"  # not an object
    reply, out = failed(sb, call, "invalid_field")
    assert reply["error"]["field"].startswith("openai"), reply["error"]
    patch = apply_patch_call("update_file", "kept.txt", UPDATE)
    patch["operation"] = {"type": "rename_file", "path": "kept.txt"}
    _, out = failed(sb, patch, "invalid_field")
    assert out["status"] == "failed" and out["output"]
    _still_works(sb)


def test_an_unserved_item_type_is_refused(sb: Sandbox) -> None:
    reply = sb.request({"openai": {"type": "code_interpreter_call", "id": "ci_1", "code": "print(1)"}})
    assert reply["ok"] is False and reply["error"]["code"] in ("unknown_action", "unknown_tool"), reply
    _still_works(sb)


def test_the_same_items_over_http(gw: RunningGateway, sb: Sandbox) -> None:
    call = shell_call("echo over-http")
    assert item(over_http(gw, sb, {"openai": call}), call)["output"][0]["stdout"] == "over-http\n"
    patch = apply_patch_call("update_file", "absent-too.txt", UPDATE)
    reply = over_http(gw, sb, {"openai": patch})
    assert reply["error"]["code"] == "no_such_file" and item(reply, patch, ok=False)["status"] == "failed"
    _still_works(sb)


def test_a_patch_envelope_touches_only_the_operations_own_path(sb: Sandbox) -> None:
    """The caller approved ``operation.path``: a V4A envelope naming other files inside the diff
    (the codex form a model may paste) never reaches them."""
    sb.files.write("/workspace/env-target.txt", "a\n")
    sb.files.write("/workspace/env-other.txt", "a\n")
    envelopes = [
        "*** Begin Patch\n*** Update File: env-other.txt\n@@\n-a\n+b\n*** End Patch\n",
        "*** Begin Patch\n*** Update File: env-target.txt\n@@\n-a\n+b\n"
        "*** Update File: env-other.txt\n@@\n-a\n+b\n*** End Patch\n",
        "*** Begin Patch\n*** Update File: env-target.txt\n@@\n-a\n+b\n*** Delete File: env-other.txt\n*** End Patch\n",
        "*** Begin Patch\n*** Update File: env-target.txt\n*** Move to: env-other.txt\n@@\n-a\n+b\n*** End Patch\n",
    ]
    for diff in envelopes:
        call = apply_patch_call("update_file", "env-target.txt", diff)
        reply = sb.request({"openai": call})
        item(reply, call, ok=reply["ok"])
        assert cat(sb, "/workspace/env-other.txt") == "a\n", (diff, reply)
        assert exists(sb, "/workspace/env-target.txt"), (diff, reply)
        sb.files.write("/workspace/env-target.txt", "a\n")


def test_a_tools_error_names_the_field_of_the_item(sb: Sandbox) -> None:
    """apply_patch's errors name the item's own field (``openai.operation.diff``); they once named the
    native field (``action.diff``), which the item the client sent does not have."""
    sb.files.write("/workspace/field.txt", "a\n")
    reply, _ = failed(sb, apply_patch_call("update_file", "field.txt", "@@\n-zzz\n+y\n"), "patch_failed")
    assert reply["error"]["field"].startswith("openai."), reply["error"]


def test_a_computer_call_always_answers_with_its_item(sb: Sandbox) -> None:
    """A computer_call's output is its screenshot: with ``screenshot: false`` it once answered ``ok:
    true`` with an empty ``result``. Now it takes it anyway or refuses the envelope; never a success
    with nothing to send back."""
    call = computer_call({"type": "move", "x": 5, "y": 5})
    reply = sb.request({"openai": call, "screenshot": False})
    if reply["ok"]:
        assert screenshot_of(item(reply, call)).size == SCREEN
    else:
        assert reply["error"]["code"] == "invalid_field", reply


def test_an_asked_screenshot_is_never_lost(sb: Sandbox) -> None:
    """``screenshot: true`` on a shell_call (whose output cannot hold an image) brings the image's data
    in the reply's ``screenshot``, as for a native action; it once answered only the image's size."""
    call = shell_call("echo with-a-screenshot")
    reply = sb.request({"openai": call, "screenshot": True})
    assert item(reply, call)["output"][0]["stdout"] == "with-a-screenshot\n"
    assert reply["screenshot"].get("data"), reply["screenshot"]
