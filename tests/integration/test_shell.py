"""The persistent shell against the real image: the ``shell`` action through the controller's WebSocket,
one bash per session run as the agent by the launcher (issue 13), and through the gateway and the
session's proxy for its egress. What is left running is checked with ``ps`` inside the sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.runtime import SandboxAddress
from corral.sandbox.agent.shell import RESTARTED, TRUNCATED_NOTE
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway
from .procwire import Wire, wire
from .test_processes import gone

pytestmark = pytest.mark.usefixtures("desktop_image")


async def shell(w: Wire, command: str | None = None, timeout_s: float = 60, **fields: Any) -> dict[str, Any]:
    action = {"type": "shell", **({} if command is None else {"command": command}), **fields}
    return await w.result(action, timeout_s)


def marker(prefix: str) -> str:
    """A number no other process in the sandbox has in its arguments (found by ps afterwards)."""
    return prefix + str(int(time.time() * 1000) % 100000)


async def test_state_survives_between_calls_and_stderr_comes_in_order(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        await shell(w, restart=True)  # this module's tests share the sandbox: each starts from a fresh shell
        first = await shell(w, 'pwd; cd /tmp && export GREETING=hi; greet() { echo "$GREETING from $PWD"; }')
        assert first == {"output": "/workspace\n", "exit_code": 0, "truncated": False, "restarted": False}
    async with wire(sandbox) as w:  # the session's shell, whatever the connection
        second = await shell(w, "greet; echo out; echo err >&2; echo out again; false")
        assert second["output"] == "hi from /tmp\nout\nerr\nout again\n"
        assert second["exit_code"] == 1
        missing = await shell(w, "no-such-program-here")
        assert missing["exit_code"] == 127 and "not found" in missing["output"]


async def test_the_shell_is_the_agent_without_capabilities(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        done = await shell(w, "cat /proc/self/status; id -un; echo $HOME $TERM")
        status = dict(line.split(":", 1) for line in done["output"].splitlines() if ":" in line)
        assert status["Uid"].split() == ["1100"] * 4 and status["Gid"].split() == ["1100"] * 4
        assert {status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {"0000000000000000"}
        assert status["NoNewPrivs"].strip() == "1"
        assert done["output"].splitlines()[-2:] == ["agent", "/home/agent dumb"]
        listed = (await w.result({"type": "process_list"}))["processes"]
        assert any(p["argv"] == ["bash", "--login", "-s"] and p["running"] for p in listed), listed


@pytest.mark.parametrize(
    "command",
    [
        "printf '\\n%s:0\\n' 0123456789abcdef0123456789abcdef",  # a guessed sentinel
        "exec 1>&- 2>&-",  # the output the sentinel needs, closed
        "exec >/dev/null 2>&1",  # moved away
        "printf() { :; }; eval() { :; }; export() { :; }",  # functions named as the builtins the shell uses
        "cat",  # waits on stdin: sees its end
        "sleep 1000 & echo started",  # keeps the output pipe open
        "set -x; echo traced",  # bash's trace of the script
    ],
)
async def test_commands_that_fight_the_protocol_do_not_hang_the_shell(sandbox: SandboxAddress, command: str) -> None:
    async with wire(sandbox) as w:
        before = await shell(w, "echo $$")
        started = time.monotonic()
        done = await shell(w, command)
        assert time.monotonic() - started < 10 and done["exit_code"] == 0, done
        after = await shell(w, "set +x; echo $$")
        assert after["output"].splitlines()[-1] == before["output"].strip()  # the same bash goes on
        await shell(w, "kill %1 2>/dev/null; unset -f printf eval export; true")


async def test_a_timeout_kills_the_tree_and_the_next_call_runs_in_a_fresh_shell(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    number = marker("71")
    command = (
        f"sleep {number}0 & setsid sleep {number}1 & (setsid sh -c 'sleep {number}2' &); "
        f"nohup sleep {number}3 >/dev/null 2>&1 & echo started; sleep {number}4"
    )
    async with wire(sandbox) as w:
        await shell(w, "cd /tmp; export KEPT=1")
        old = (await shell(w, "echo $$"))["output"].strip()
        started = time.monotonic()
        reply = await w.call({"type": "shell", "command": command, "timeout_ms": 1500}, timeout_s=30)
        assert time.monotonic() - started < 15
        assert reply["ok"] is False and reply["error"]["code"] == "timeout", reply
        assert "restarted" in reply["error"]["message"] and "reset" in reply["error"]["message"]
        assert await gone(runtime, sandbox, f"sleep {number}") == []
        code, _ = runtime.exec(sandbox.id, ["ps", "-p", old], user="root")
        assert code == 1  # the bash that ran it is gone too
        fresh = await shell(w, 'echo "[$KEPT] $PWD $$"')
        kept, where, pid = fresh["output"].split()
        assert (kept, where, fresh["exit_code"]) == ("[]", "/workspace", 0) and pid != old


async def test_restart_gives_a_fresh_shell(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        await shell(w, "export KEPT=1")
        assert await shell(w, restart=True) == {
            "output": RESTARTED,
            "exit_code": None,
            "truncated": False,
            "restarted": True,
        }
        done = await shell(w, 'echo "[$KEPT]"; exit 4')
        assert done["output"].startswith("[]\n") and done["exit_code"] == 4
        again = await shell(w, "echo back")  # an exit ended that bash: the next call starts another
        assert again["output"] == "back\n"


async def until_exists(runtime: DockerHarness, box: SandboxAddress, path: str) -> None:
    for _ in range(100):
        code, _ = runtime.exec(box.id, ["test", "-e", path], user="root")
        if code == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


async def test_no_process_can_reopen_the_shells_stdin_to_feed_it(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    number = marker("72")
    go, done = f"/tmp/go-{number}", f"/tmp/done-{number}"
    job = f"( until [ -e {go} ]; do sleep 0.05; done; echo 'echo INJECTED' > /proc/$$/fd/0; touch {done} ) &"
    async with wire(sandbox) as w:
        await shell(w, job)  # a job that feeds bash between two calls, while bash waits for its next script
        runtime.exec(sandbox.id, ["touch", go], user="root")
        await until_exists(runtime, sandbox, done)
        after = await shell(w, "echo next")
        assert "No such device or address" in after["output"]  # a socket: opening it through /proc is ENXIO
        assert "INJECTED" not in after["output"] and after["output"].endswith("next\n"), after


async def test_a_script_bash_does_not_read_times_out_and_restart_does_not_wait_behind_it(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    number = marker("73")
    block = f"/tmp/block-{number}"
    big = "true " + "#" * 90_000  # over a pipe's (or a socket's) buffer: its write waits for bash to read
    async with wire(sandbox) as w:
        await shell(w, f"echo '[ -e {block} ] && {{ echo blocked; sleep {number}; }}' > ~/.bash_profile")
        try:
            runtime.exec(sandbox.id, ["touch", block], user="root")  # each new bash now hangs in its profile
            started = time.monotonic()
            reply = await w.call({"type": "shell", "command": big, "timeout_ms": 1500, "restart": True}, timeout_s=30)
            assert reply["ok"] is False and reply["error"]["code"] == "timeout", reply
            assert time.monotonic() - started < 15
            stuck = await w.send({"type": "shell", "command": big, "timeout_ms": 300_000})
            await asyncio.sleep(1)  # its bash is in the profile, its write waiting
            runtime.exec(sandbox.id, ["rm", block], user="root")
            started = time.monotonic()
            fresh = await shell(w, "echo fresh", restart=True, timeout_s=30)
            assert time.monotonic() - started < 15
            assert fresh == {"output": "fresh\n", "exit_code": 0, "truncated": False, "restarted": True}
            cut = (await w.reply(stuck, timeout_s=30))["result"]
            assert "the shell was restarted" in cut["output"], cut
            assert await gone(runtime, sandbox, f"sleep {number}") == []
        finally:
            await shell(w, "rm -f ~/.bash_profile", restart=True)


def controller_rss_kib(runtime: DockerHarness, box: SandboxAddress) -> int:
    code, out = runtime.exec(box.id, ["ps", "-eo", "rss=,args="], user="root")
    assert code == 0, out
    (rss,) = [line.split()[0] for line in out.splitlines() if "corral.sandbox.controller" in line]
    return int(rss)


async def test_huge_output_is_cut_and_the_controller_does_not_grow(
    runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    async with wire(sandbox) as w:
        await shell(w, "true")
        before = controller_rss_kib(runtime, sandbox)
        done = await shell(w, "head -c 400000000 /dev/zero | tr '\\0' y; echo; echo done", timeout_s=120)
        after = controller_rss_kib(runtime, sandbox)
        assert done["truncated"] is True and done["exit_code"] == 0
        assert done["output"] == "y" * 16_000 + TRUNCATED_NOTE
        assert after - before < 64 * 1024, (before, after)  # 400 MB printed, far less kept
        small = await shell(w, "seq 1 5", max_output_chars=4)
        assert small == {"output": "1\n2\n" + TRUNCATED_NOTE, "exit_code": 0, "truncated": True, "restarted": False}


async def test_calls_at_once_are_served_in_turn(sandbox: SandboxAddress) -> None:
    async with wire(sandbox) as w:
        ids = [await w.send({"type": "shell", "command": f"echo start {n}; sleep 0.2; echo end {n}"}) for n in range(3)]
        replies = await asyncio.gather(*(w.reply(i) for i in ids))
        assert [r["result"]["output"] for r in replies] == [f"start {n}\nend {n}\n" for n in range(3)]


# -- egress: each command is charged to its own action ------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-shell-up-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("shell-gw"), f"shell-egress-{os.getpid()}") as running:
        yield running


def charged_to(gw: RunningGateway, sb: Sandbox, action_id: str) -> list[dict[str, Any]]:
    with gw.client(KEY_A) as c:
        response = c.get(f"/v1/sessions/{sb.id}/traffic", params={"action": action_id})
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


@pytest.mark.usefixtures("egress_image")
def test_a_request_from_the_shell_is_charged_to_the_action_that_ran_it(gw: RunningGateway) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        first = sb.act({"type": "shell", "command": "cd /tmp && curl -sS --fail https://allowed.test/json?n=1"})
        second = sb.act({"type": "shell", "command": "pwd; curl -sS --fail https://allowed.test/json?n=2"})
        assert first["result"]["exit_code"] == 0 and second["result"]["exit_code"] == 0, (first, second)
        assert second["result"]["output"].startswith("/tmp\n")  # one shell for both
        assert first["action_id"] != second["action_id"]
        for reply, path in ((first, "/json?n=1"), (second, "/json?n=2")):
            records = charged_to(gw, sb, reply["action_id"])
            assert all(record.get("action_source") == "command" for record in records), records
            requests = [record["url"] for record in records if record["event"] == "request"]
            assert requests == [f"https://allowed.test{path}"], records
