"""The vendor tools from the attacker's side, for real: a tool_use ``bash``, a ``local_shell_call`` and
a ``shell_call`` run as the agent's uid and can neither read the controller's secret, reach its ports
nor kill it; nobody runs as root through ``local_shell_call``; the editor and apply_patch write nowhere
the agent may not (symlinks, ``../``, /proc); and a hostile page served through the session's proxy
cannot drive the new tools through the controller's port (docs/security.md's stance, unchanged)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway
from .test_inner_boundary import AGAINST_THE_CONTROLLER
from .vendor_fixtures import apply_patch_call, item, local_shell_call, shell_call, text_of, tool_result, tool_use

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SECRET = "/run/corral/controller/secret"  # the controller's (corral, 0400)
POLICY = "/run/corral/chromium-policy.json"  # root's, readable by all, writable by none of them


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-vt-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-upstream-vt")


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"it-vendor-attack-{time.time_ns()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("gw"), instance) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sandbox:
        yield sandbox


def _root(runtime: DockerHarness, sb: Sandbox, *argv: str) -> str:
    code, out = runtime.exec(sb.container, list(argv), user="root")
    assert code == 0, out
    return out


def _secret(runtime: DockerHarness, sb: Sandbox) -> str:
    """The controller's secret, read as its owner (root in the sandbox holds no CAP_DAC_OVERRIDE)."""
    code, out = runtime.exec(sb.container, ["cat", SECRET], user="corral")
    assert code == 0 and out.strip(), out
    return out


def _controller(runtime: DockerHarness, sb: Sandbox) -> int:
    return int(_root(runtime, sb, "pgrep", "-f", "corral.sandbox.controller").split()[0])


def _anthropic(sb: Sandbox, block: dict[str, Any]) -> dict[str, Any]:
    return sb.request({"anthropic": block})


def _openai(sb: Sandbox, call: dict[str, Any]) -> dict[str, Any]:
    return sb.request({"openai": call})


def _seen(output: str) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return seen


def test_tool_commands_run_as_the_agent_and_cannot_touch_the_controller(sb: Sandbox, runtime: DockerHarness) -> None:
    controller = _controller(runtime, sb)
    write = tool_use("write", {"file_path": "against.py", "content": AGAINST_THE_CONTROLLER})
    tool_result(_anthropic(sb, write), write)
    argv = ["python3", "/workspace/against.py", str(controller), "8081"]
    bash = tool_use("bash", {"command": " ".join(argv)})
    local = local_shell_call(argv)
    shell = shell_call(" ".join(argv))
    ran = {
        "bash": text_of(tool_result(_anthropic(sb, bash), bash)),
        "local_shell": json.loads(item(_openai(sb, local), local)["output"])["output"],
        "shell": item(_openai(sb, shell), shell)["output"][0]["stdout"],
    }
    for tool, output in ran.items():
        seen = _seen(output)
        assert seen["uid"] == 1100, (tool, seen)
        for attempt in ("kill", "stop", "environ", "mem", "secret", "secret_dir", "proxy_token"):
            assert seen[attempt] == "PermissionError", (tool, seen)
        assert seen["ptrace"] == os.strerror(1), (tool, seen)  # EPERM
        for port in ("connect 8765", "connect 9222", "connect control"):
            assert seen[port] == "ConnectionRefusedError", (tool, seen)
    # The same from the shell's own tools, and the controller lived through all of it.
    b = tool_use("bash", {"command": f"cat {SECRET}; kill -9 {controller}"})
    out = text_of(tool_result(_anthropic(sb, b), b, is_error=True))  # both refusals went to stderr
    assert "Permission denied" in out and "Operation not permitted" in out, out
    assert _controller(runtime, sb) == controller
    assert sb.act({"type": "cursor_position"})["ok"] is True


@pytest.mark.parametrize("user", ["root", "corral", "0"])
def test_a_local_shell_call_as_another_user_is_refused(sb: Sandbox, user: str) -> None:
    marker = f"/tmp/ran-as-{user}"
    call = local_shell_call(["touch", marker], user=user)
    reply = _openai(sb, call)
    out = item(reply, call, ok=False)
    assert reply["error"]["code"] == "invalid_field" and reply["error"]["field"].startswith("openai"), reply
    assert reply["error"]["message"] in out["output"]
    json.loads(out["output"])  # the error in its JSON, as the model reads a local_shell_call_output
    assert sb.exec(argv=["test", "-e", marker]).exit_code == 1
    assert sb.exec("id -u").stdout == "1100\n"


def _must_fail(sb: Sandbox, dialect: str, call: dict[str, Any], secret: str) -> None:
    reply = sb.request({dialect: call})
    assert reply["ok"] is False, (call, reply)
    assert reply["error"]["code"] in ("permission_denied", "no_such_file"), (call, reply["error"])
    assert secret.strip() not in json.dumps(reply), call
    if dialect == "anthropic":
        tool_result(reply, call, ok=False)
    else:
        assert item(reply, call, ok=False)["status"] == "failed"


def _editor(command: str, path: str, **more: Any) -> dict[str, Any]:
    return tool_use("str_replace_editor", {"command": command, "path": path, **more})


def test_the_editor_and_apply_patch_write_nowhere_the_agent_may_not(sb: Sandbox, runtime: DockerHarness) -> None:
    secret = _secret(runtime, sb)
    links = f"ln -sfn {SECRET} link-secret && ln -sfn /run/corral/controller link-dir"
    assert sb.exec(links, cwd="/workspace").exit_code == 0
    controller = _controller(runtime, sb)
    refused: list[tuple[str, dict[str, Any]]] = [
        ("anthropic", _editor("view", "/workspace/link-secret")),
        ("anthropic", _editor("view", "/workspace/../" + SECRET[1:])),
        ("anthropic", _editor("view", "/workspace/link-dir")),
        ("anthropic", _editor("create", "/workspace/link-dir/evil", file_text="x")),
        ("anthropic", _editor("create", "/workspace/../run/corral/evil", file_text="x")),
        ("anthropic", _editor("view", f"/proc/{controller}/environ")),
        ("anthropic", tool_use("str_replace_based_edit_tool", {"command": "view", "path": "/workspace/link-secret"})),
        ("anthropic", tool_use("read", {"file_path": "../../run/corral/controller/secret"})),
        ("anthropic", tool_use("write", {"file_path": "../../run/corral/controller/secret", "content": "x"})),
        ("anthropic", tool_use("write", {"file_path": "link-dir/secret", "content": "x"})),
        ("anthropic", tool_use("write", {"file_path": "/run/corral/evil", "content": "x"})),
        ("anthropic", tool_use("grep", {"pattern": ".", "path": "/run/corral/controller"})),
        ("anthropic", tool_use("glob", {"pattern": "**", "path": "/run/corral/controller"})),
        ("anthropic", tool_use("grep", {"pattern": ".", "path": "link-dir"})),
        ("openai", apply_patch_call("create_file", "../../run/corral/evil", "+x\n")),
        ("openai", apply_patch_call("create_file", "link-dir/evil", "+x\n")),
        ("openai", apply_patch_call("update_file", "link-secret", "@@\n-x\n+y\n")),
        ("openai", apply_patch_call("delete_file", POLICY)),
        ("openai", apply_patch_call("delete_file", "../../run/corral/controller/secret")),
    ]
    for dialect, call in refused:
        _must_fail(sb, dialect, call, secret)
    # A command in the controller's directory: it cannot even start there.
    inside = local_shell_call(["cat", "secret"], working_directory="/run/corral/controller")
    reply = _openai(sb, inside)
    item(reply, inside, ok=reply["ok"])
    assert secret.strip() not in json.dumps(reply) and (not reply["ok"] or "Permission denied" in json.dumps(reply))
    assert _secret(runtime, sb) == secret
    assert "evil" not in _root(runtime, sb, "ls", "-A", "/run/corral").split()
    assert runtime.exec(sb.container, ["ls", "-A", "/run/corral/controller"], user="corral") == (0, "secret\n")


def test_an_edit_through_a_link_changes_the_link_at_most(sb: Sandbox, runtime: DockerHarness) -> None:
    """A file the agent may read but not write, behind a link in /workspace: an edit may replace the
    link with an edited copy (the write is a rename in /workspace), never the file it names."""
    policy = _root(runtime, sb, "cat", POLICY)
    first = policy.splitlines()[0]
    edits: list[tuple[str, dict[str, Any]]] = [
        ("anthropic", _editor("str_replace", "/workspace/link-policy", old_str=first, new_str="x")),
        ("anthropic", _editor("insert", "/workspace/link-policy", insert_line=0, new_str="x")),
        ("anthropic", tool_use("edit", {"file_path": "link-policy", "old_string": first, "new_string": "x"})),
        ("anthropic", tool_use("write", {"file_path": "link-policy", "content": "x"})),
        ("openai", apply_patch_call("update_file", "link-policy", f"@@\n-{first}\n+x\n")),
        ("openai", apply_patch_call("delete_file", "link-policy")),
    ]
    for dialect, call in edits:
        assert sb.exec(f"ln -sfn {POLICY} link-policy", cwd="/workspace").exit_code == 0
        reply = sb.request({dialect: call})
        if dialect == "anthropic":
            tool_result(reply, call, ok=reply["ok"])
        else:
            item(reply, call, ok=reply["ok"])
        assert _root(runtime, sb, "cat", POLICY) == policy, call
    # An edit's undo after its file was swapped for a link: the agent's own reach still.
    tool_result(sb.request({"anthropic": (made := _editor("create", "/workspace/swap.txt", file_text="a\n"))}), made)
    tool_result(
        sb.request({"anthropic": (changed := _editor("str_replace", "/workspace/swap.txt", old_str="a", new_str="b"))}),
        changed,
    )
    assert sb.exec(f"rm swap.txt && ln -s {POLICY} swap.txt", cwd="/workspace").exit_code == 0
    undo = _editor("undo_edit", "/workspace/swap.txt")
    reply = sb.request({"anthropic": undo})
    tool_result(reply, undo, ok=reply["ok"])
    assert _root(runtime, sb, "cat", POLICY) == policy


def test_proc_self_is_the_agents_own(sb: Sandbox, runtime: DockerHarness) -> None:
    """The editor reads as the agent: /proc/self is an agent process, never the controller."""
    secret = _secret(runtime, sb).strip()
    for path in ("/proc/self/status", "/proc/self/environ", "/proc/self/cmdline"):
        block = tool_use("str_replace_editor", {"command": "view", "path": path})
        reply = sb.request({"anthropic": block})
        assert secret not in json.dumps(reply) and "CORRAL_CONTROLLER" not in json.dumps(reply), reply
        if reply["ok"] and path.endswith("status"):
            assert "Uid:\t1100" in text_of(tool_result(reply, block)), reply
        if not reply["ok"]:
            tool_result(reply, block, ok=False)
    status = tool_use("read", {"file_path": "/proc/self/status"})
    reply = sb.request({"anthropic": status})
    assert not reply["ok"] or "Uid:\t1100" in text_of(tool_result(reply, status)), reply


def _bash(sb: Sandbox, command: str) -> tuple[str, str]:
    """A bash tool_use's text and the action id its requests are charged to."""
    block = tool_use("bash", {"command": command})
    reply = _anthropic(sb, block)
    # A command that wrote to stderr (curl's refusal) is an is_error result, as the reference bash marks it.
    wrote_stderr = bool(reply.get("result", {}).get("tool_result", {}).get("is_error"))
    return text_of(tool_result(reply, block, is_error=wrote_stderr)), str(reply["action_id"])


def test_tool_commands_go_out_only_through_the_proxy(sb: Sandbox, upstream: Upstream, runtime: DockerHarness) -> None:
    """A call's own environment (local_shell_call's env, an unset in the persistent bash) opens no
    way out past the session's proxy and its allowlist: what gets out is audited, charged to the call."""
    allowed = local_shell_call(["curl", "-sS", "--max-time", "10", "https://allowed.test/json?via=local-shell"])
    assert json.loads(item(_openai(sb, allowed), allowed)["output"])["metadata"]["exit_code"] == 0
    no_proxy = {"HTTPS_PROXY": "", "https_proxy": "", "ALL_PROXY": "", "NO_PROXY": "*", "no_proxy": "*"}
    url = "https://allowed.test/json?via=env-bypass"
    bypass = local_shell_call(["curl", "-sS", "--max-time", "5", url], env=no_proxy)
    assert json.loads(item(_openai(sb, bypass), bypass)["output"])["metadata"]["exit_code"] != 0
    out, _ = _bash(sb, "curl -sS --max-time 5 --noproxy '*' https://allowed.test/json?via=noproxy-bypass; echo exit=$?")
    assert "exit=0" not in out and "exit=" in out, out
    # Unset in the persistent bash: whatever still gets out went through the proxy, on the record.
    unset = "unset HTTPS_PROXY https_proxy ALL_PROXY; curl -sS --max-time 5 https://allowed.test/json?via=unset; echo"
    out, action_id = _bash(sb, unset + " exit=$?")
    if "exit=0" in out:
        records = sb.traffic(action=action_id)
        assert any(r.event == "request" and r.host == "allowed.test" for r in records), records
    refused = shell_call("curl -sS -w '\\nstatus=%{http_code}' https://other.test/private")
    assert item(_openai(sb, refused), refused)["output"][0]["stdout"].rstrip().endswith("status=403")
    paths = [str(hit.get("path")) for hit in upstream.hits(runtime)]
    assert any("via=local-shell" in p for p in paths), paths
    assert not any("bypass" in p or "private" in p for p in paths), paths


def test_a_hostile_page_cannot_drive_the_new_tools(gw: RunningGateway, sb: Sandbox, runtime: DockerHarness) -> None:
    sb.navigate("https://allowed.test/page/attack-tools.html")
    deadline = time.monotonic() + 60
    while not (title := str(sb.page_info().title)).startswith("done"):
        assert time.monotonic() < deadline, title
        time.sleep(0.2)
    seen = json.loads(title.removeprefix("done "))
    assert len(seen) == 5 * 3 * 2, seen
    for attempt, outcome in seen.items():
        if attempt.startswith("fetch"):
            assert outcome == "failed", (attempt, seen)  # the connection itself is refused
        else:
            assert not outcome.startswith("message"), (attempt, seen)
    assert "pwned-by-page" not in _root(runtime, sb, "ls", "-A", "/workspace", "/tmp")
    with gw.client() as c:
        events = c.get(f"/v1/sessions/{sb.id}/recording/events").json()["events"]
    assert "pwned-by-page" not in json.dumps(events)
