"""run_code against the real image through a real gateway: a Jupyter kernel per context, started on
first use as the agent through the launcher (corral.sandbox.kernels), its results in E2B's shape,
its bad input (a timeout, a hung kernel, the memory limit, floods, a chart too big for the reply)
each a clear result with the session still working, and its egress through the session's proxy
to the fake upstream (names under .test, on this machine only)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-code-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-upstream-code")


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"code-{os.getpid()}"
    # 1 GiB: a kernel that allocates past it is OOM-killed by the sandbox's memory cgroup.
    with gateway_to(upstream, tmp_path_factory.mktemp("code-gw"), instance, default_memory_mb=1024) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


@pytest.fixture()
def fresh(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


def run(sb: Sandbox, code: str, **fields: Any) -> dict[str, Any]:
    reply = sb.act({"type": "run_code", "code": code, "timeout_ms": 120_000, **fields})
    assert reply["ok"] is True, reply
    result: dict[str, Any] = reply["result"]
    return result


def act(sb: Sandbox, action: dict[str, Any]) -> dict[str, Any]:
    reply = sb.act(action)
    assert reply["ok"] is True, reply
    result: dict[str, Any] = reply["result"]
    return result


def main(result: dict[str, Any]) -> dict[str, str]:
    (value,) = [out["data"] for out in result["results"] if out["is_main_result"]]
    return dict(value)


def kernel_pid(sb: Sandbox, context: str = "default") -> int:
    listed = act(sb, {"type": "list_code_contexts"})["contexts"]
    (pid,) = [c["pid"] for c in listed if c["name"] == context]
    return int(pid)


def test_state_lasts_between_calls_and_printing_is_logged(sb: Sandbox) -> None:
    first = run(sb, "x = 21\nprint('hello')\nx * 2", context="state")
    assert first["error"] is None and first["state_lost"] is False and first["timed_out"] is False
    assert main(first) == {"text/plain": "42"}
    assert first["logs"] == {"stdout": ["hello\n"], "stderr": [], "truncated": False}
    second = run(sb, "import sys\nprint('oops', file=sys.stderr)\nx", context="state")
    assert main(second) == {"text/plain": "21"}
    assert second["logs"]["stderr"] == ["oops\n"]
    assert second["execution_count"] == first["execution_count"] + 1


def test_a_matplotlib_chart_is_a_png_result(sb: Sandbox) -> None:
    result = run(sb, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
    assert result["error"] is None, result["error"]
    (chart,) = [out for out in result["results"] if "image/png" in out["data"]]
    assert base64.b64decode(chart["data"]["image/png"]).startswith(PNG_MAGIC)
    assert chart["data"]["text/plain"].startswith("<Figure") and chart["is_main_result"] is False


def test_a_pandas_dataframe_is_an_html_table(sb: Sandbox) -> None:
    result = run(sb, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    value = main(result)
    assert "<table" in value["text/html"] and "<td>x</td>" in value["text/html"]
    assert "a  b" in value["text/plain"]


def test_other_mime_types_are_kept_or_named_as_omitted(sb: Sandbox) -> None:
    code = (
        "from IPython.display import display\n"
        "display({'text/plain': 'p', 'text/markdown': '# m', 'application/json': {'k': [1]},"
        " 'application/vnd.custom+json': {'a': 1}}, raw=True)"
    )
    (out,) = run(sb, code)["results"]
    assert out["data"] == {"text/plain": "p", "text/markdown": "# m", "application/json": '{"k": [1]}'}
    assert out["omitted"] == ["application/vnd.custom+json"]


def test_an_exception_has_its_traceback_without_colours(sb: Sandbox) -> None:
    result = run(sb, "def f():\n    return 1 / 0\nf()")
    error = result["error"]
    assert (error["name"], error["value"]) == ("ZeroDivisionError", "division by zero")
    assert "return 1 / 0" in error["traceback"] and "\x1b[" not in error["traceback"]
    assert result["state_lost"] is False and result["results"] == []


def test_a_timeout_interrupts_the_cell_and_keeps_the_kernel(sb: Sandbox) -> None:
    run(sb, "kept = 'still here'", context="timeout")
    pid = kernel_pid(sb, "timeout")
    result = run(sb, "import time\nprint('started')\ntime.sleep(60)", context="timeout", timeout_ms=1500)
    assert result["timed_out"] is True and result["state_lost"] is False
    assert result["error"]["name"] == "Timeout" and "KeyboardInterrupt" in result["error"]["traceback"]
    assert result["logs"]["stdout"] == ["started\n"]
    assert main(run(sb, "kept", context="timeout")) == {"text/plain": "'still here'"}
    assert kernel_pid(sb, "timeout") == pid


def test_a_kernel_that_ignores_the_interrupt_is_restarted(sb: Sandbox) -> None:
    run(sb, "lost = 1", context="hung")
    pid = kernel_pid(sb, "hung")
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.05)"
    result = run(sb, code, context="hung", timeout_ms=1000)
    assert result["timed_out"] is True and result["state_lost"] is True
    assert result["error"]["name"] == "KernelRestarted" and "SIGINT" in result["error"]["value"]
    assert main(run(sb, "'lost' in dir()", context="hung")) == {"text/plain": "False"}
    assert kernel_pid(sb, "hung") != pid
    processes = act(sb, {"type": "process_list"})["processes"]
    assert next(p for p in processes if p["pid"] == pid)["running"] is False


def test_a_kernel_killed_by_the_memory_limit_is_reported_and_replaced(fresh: Sandbox) -> None:
    run(fresh, "before = 1")
    code = "chunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))"
    result = run(fresh, code)
    assert result["state_lost"] is True and result["timed_out"] is False
    assert result["error"]["name"] == "KernelDied", result["error"]
    assert "memory" in result["error"]["value"], result["error"]
    assert main(run(fresh, "'before' in dir()")) == {"text/plain": "False"}
    ran = act(fresh, {"type": "exec", "command": "echo alive"})
    assert ran["stdout"] == "alive\n"


def test_an_output_flood_is_cut_at_max_output_bytes(sb: Sandbox) -> None:
    result = run(sb, "for i in range(100_000):\n    print('y' * 99)\n'done'", max_output_bytes=50_000)
    assert result["logs"]["truncated"] is True
    assert sum(len(chunk.encode()) for chunk in result["logs"]["stdout"]) <= 50_000
    assert main(result) == {"text/plain": "'done'"}


def test_a_result_too_big_for_the_reply_keeps_its_text(sb: Sandbox) -> None:
    code = (
        "from IPython.display import display\n"
        "display({'text/plain': 'big chart', 'image/png': 'A' * (8 << 20)}, raw=True)"
    )
    (out,) = run(sb, code)["results"]
    assert out["data"] == {"text/plain": "big chart"} and out["omitted"] == ["image/png"]


def test_a_kernel_that_sends_garbage_cannot_harm_the_controller(sb: Sandbox) -> None:
    # The cell is the agent's code in the kernel, which holds the key: it can send anything on IOPub.
    code = (
        "k = get_ipython().kernel\n"
        "session, sock, parent = k.session, k.iopub_socket, k.get_parent('shell')\n"
        "sock.send_multipart([b'x', b'<IDS|MSG>', b'bad signature', b'{}', b'{}', b'{}', b'{}'])\n"
        "session.send(sock, 'display_data', {'data': ['not', 'a', 'bundle']}, parent=parent)\n"
        "session.send(sock, 'stream', {'name': 'stdout', 'text': 'y' * (30 << 20)}, parent=parent)\n"
        "print('after')"
    )
    result = run(sb, code, context="hostile")
    assert result["error"] is None and result["state_lost"] is False, result["error"]
    assert [out["data"] for out in result["results"]] == [{}]  # the bundle that was not one: empty
    assert all(len(chunk) < 1 << 20 for chunk in result["logs"]["stdout"])  # the 30 MiB frame was refused
    assert main(run(sb, "1 + 1", context="hostile")) == {"text/plain": "2"}
    act(sb, {"type": "remove_code_context", "context": "hostile"})


def controller_rss_mib(runtime: DockerHarness, container: str) -> float:
    """The controller's resident memory (root reads it; it is the only python of corral's)."""
    _, out = runtime.exec(container, ["ps", "-u", "corral", "-o", "rss=,args="], user="root")
    rows = [line.split(None, 1) for line in out.splitlines() if "corral.sandbox.controller" in line]
    return sum(int(rss) for rss, _ in rows) / 1024


def container_of(runtime: DockerHarness, gw: RunningGateway, sb: Sandbox) -> str:
    """The session's sandbox container: the one holding a file only its agent wrote."""
    marker = f"/tmp/which-{os.getpid()}-{sb.id}"
    act(sb, {"type": "exec", "argv": ["touch", marker]})
    # This gateway's sandboxes only: the other worker's tests start and stop theirs meanwhile, and an
    # exec in one that stopped since the listing is the engine's 409 (seen in a rehearsal).
    labels = ["corral.role=sandbox", f"corral.gateway={gw.settings.instance}"]
    names = [c.name for c in runtime.client.containers.list(filters={"label": labels})]
    (name,) = [n for n in names if _holds(runtime, n, marker)]
    return name


def _holds(runtime: DockerHarness, container: str, path: str) -> bool:
    try:
        return runtime.exec(container, ["test", "-e", path], user="root")[0] == 0
    except docker.errors.APIError:  # stopped since it was listed (a pool's sandbox replaced): not it
        return False


def test_a_kernel_publishing_between_cells_cannot_fill_the_controllers_memory(
    sb: Sandbox, gw: RunningGateway, runtime: DockerHarness
) -> None:
    # The agent's code returns at once and leaves a thread publishing 4 MiB messages on IOPub while no
    # cell runs: nobody reads them, so they wait in the controller's ZeroMQ queue (400 MiB of them
    # here; with no bound on the queue's length, a sandbox's memory and an OOM kill of the controller).
    container = container_of(runtime, gw, sb)
    run(sb, "1", context="flooder")
    before = controller_rss_mib(runtime, container)
    code = (
        "import threading, time\n"
        "k = get_ipython().kernel\n"
        "def flood():\n"
        "    for _ in range(100):\n"
        "        k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'z' * (4 << 20)})\n"
        "    open('/tmp/flood-sent', 'w').close()\n"
        "threading.Thread(target=flood).start()\n"
        "'started'"
    )
    assert main(run(sb, code, context="flooder")) == {"text/plain": "'started'"}
    waited = run(sb, "import os, time\nwhile not os.path.exists('/tmp/flood-sent'): time.sleep(0.1)\n'sent'")
    assert main(waited) == {"text/plain": "'sent'"}
    time.sleep(2)  # what ZeroMQ takes in is taken in the background: let it settle before measuring
    grown = controller_rss_mib(runtime, container) - before
    assert grown < 100, f"the controller took {grown:.0f} MiB of messages nobody read"
    # The kernel still works; the queued messages belong to no cell and are passed over.
    assert main(run(sb, "2 + 2", context="flooder")) == {"text/plain": "4"}
    act(sb, {"type": "remove_code_context", "context": "flooder"})


def test_restart_and_remove_contexts(sb: Sandbox) -> None:
    run(sb, "y = 2", context="life")
    old = kernel_pid(sb, "life")
    info = act(sb, {"type": "restart_code_context", "context": "life"})
    assert info["name"] == "life" and info["pid"] != old and info["execution_count"] == 0 and info["state"] == "idle"
    assert main(run(sb, "'y' in dir()", context="life")) == {"text/plain": "False"}
    assert act(sb, {"type": "remove_code_context", "context": "life"}) == {"name": "life", "removed": True}
    assert "life" not in [c["name"] for c in act(sb, {"type": "list_code_contexts"})["contexts"]]
    processes = act(sb, {"type": "process_list"})["processes"]
    assert next(p for p in processes if p["pid"] == info["pid"])["running"] is False
    assert act(sb, {"type": "remove_code_context", "context": "life"}) == {"name": "life", "removed": False}


def test_a_call_queued_on_a_removed_context_starts_no_kernel_outside_the_contexts(sb: Sandbox) -> None:
    # The agent's own calls: a long cell in "gone", a second call queued behind it, then the context
    # removed. The queued call's kernel must be the (new) context's, listed and removable, never one
    # running outside every context and past max_contexts.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(sb.act, {"type": "run_code", "code": "import time; time.sleep(20)", "context": "gone"})
        time.sleep(3)  # the first cell is running
        queued = pool.submit(sb.act, {"type": "run_code", "code": "import os; os.getpid()", "context": "gone"})
        time.sleep(1)  # the second call waits for its turn
        assert act(sb, {"type": "remove_code_context", "context": "gone"})["removed"] is True
        assert first.result()["result"]["error"]["name"] == "KernelDied"
        pid = int(main(queued.result()["result"])["text/plain"])
    listed = {c["name"]: c["pid"] for c in act(sb, {"type": "list_code_contexts"})["contexts"]}
    assert listed.get("gone") == pid, listed
    assert act(sb, {"type": "remove_code_context", "context": "gone"})["removed"] is True
    ps = act(sb, {"type": "exec", "argv": ["ps", "-o", "pid=", "-p", str(pid)]})
    assert ps["exit_code"] != 0, "the queued call's kernel still runs after its context's removal"


def test_two_contexts_are_independent(sb: Sandbox) -> None:
    run(sb, "v = 'a'", context="one")
    run(sb, "v = 'b'", context="two")
    assert main(run(sb, "v", context="one")) == {"text/plain": "'a'"}
    assert main(run(sb, "v", context="two")) == {"text/plain": "'b'"}
    assert kernel_pid(sb, "one") != kernel_pid(sb, "two")
    for name in ("one", "two"):  # the module's session stays under the cap (max_code_contexts, 8)
        act(sb, {"type": "remove_code_context", "context": name})


def test_the_kernel_is_the_agents_process_in_the_process_table(sb: Sandbox) -> None:
    run(sb, "import os\nos.getpid()", context="who")
    pid = kernel_pid(sb, "who")
    listed = [p for p in act(sb, {"type": "process_list"})["processes"] if p["pid"] == pid]
    assert listed and listed[0]["running"] is True and "boot.py" in " ".join(listed[0]["argv"])
    owner = act(sb, {"type": "exec", "argv": ["stat", "-c", "%U", f"/proc/{pid}"]})["stdout"]
    assert owner == "agent\n"
    assert main(run(sb, "os.getuid()", context="who")) == {"text/plain": "1100"}
    # The key never reached the kernel's argv or environment, and its connection file is gone.
    seen = run(sb, "import os, sys\n[k for k in os.environ if 'KEY' in k.upper()], sys.argv[1:]", context="who")
    assert main(seen) == {"text/plain": "([], [])"}
    leftover = act(sb, {"type": "exec", "command": "ls -d /tmp/corral-kernel-* 2>/dev/null | wc -l"})["stdout"]
    assert leftover == "0\n"


FORGE = """
import json, sys, time, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(f"tcp://127.0.0.1:{sys.argv[1]}")
header = json.dumps({"msg_id": "forged", "session": "s", "username": "x", "date": "", "msg_type": "execute_request",
                     "version": "5.3"}).encode()
code = "open('/tmp/forged-ran', 'w').write('yes')"
content = json.dumps({"code": code, "silent": False, "store_history": False, "user_expressions": {},
                      "allow_stdin": False}).encode()
for signature in (b"", b"0" * 64):
    sock.send_multipart([b"<IDS|MSG>", signature, header, b"{}", b"{}", content])
time.sleep(1)
print("replied" if sock.poll(500) else "no reply")
"""


def test_a_process_without_the_key_cannot_run_code_in_a_kernel(sb: Sandbox) -> None:
    # Any process that can reach 127.0.0.1 (the agent's, the browser's) can reach the kernel's ports:
    # its messages are signed with a key only the controller and the kernel hold.
    port = main(
        run(sb, "from ipykernel.kernelapp import IPKernelApp\nIPKernelApp.instance().shell_port", context="key")
    )
    forged = act(sb, {"type": "exec", "argv": ["python3", "-c", FORGE, port["text/plain"]], "timeout_ms": 30_000})
    assert forged["exit_code"] == 0 and forged["stdout"] == "no reply\n", forged
    assert act(sb, {"type": "exec", "command": "test -e /tmp/forged-ran; echo $?"})["stdout"] == "1\n"
    assert main(run(sb, "2 * 3", context="key")) == {"text/plain": "6"}
    act(sb, {"type": "remove_code_context", "context": "key"})


def test_the_kernels_requests_go_through_the_sessions_proxy(sb: Sandbox) -> None:
    code = (
        "import json, urllib.request, urllib.error\n"
        "answer = json.loads(urllib.request.urlopen('https://allowed.test/json?via=kernel').read())\n"
        "try:\n"
        "    urllib.request.urlopen('https://other.test/private')\n"
        "    refused = None\n"
        "except urllib.error.HTTPError as exc:\n"
        "    refused = exc.code\n"
        "answer['host'], answer['tls'], answer['path'], refused"
    )
    result = run(sb, code, context="net")
    assert result["error"] is None, result["error"]
    assert main(result) == {"text/plain": "('allowed.test', True, '/json?via=kernel', 403)"}


def test_a_streamed_call_sends_output_and_result_events_before_its_reply(sb: Sandbox) -> None:
    code = "print('one')\nfrom IPython.display import display\ndisplay('shown')\nprint('two')\n7"
    action = {"type": "run_code", "code": code, "stream": True}
    frames = list(sb._ws.stream({"action": action}))
    *events, reply = frames
    assert reply["ok"] is True
    kinds = [(e["event"], e.get("data") or e.get("result", {}).get("data")) for e in events]
    assert kinds == [
        ("output", "one\n"),
        ("result", {"text/plain": "'shown'"}),
        ("output", "two\n"),
        ("result", {"text/plain": "7"}),
    ]
    assert reply["result"]["logs"]["stdout"] == ["one\n", "two\n"]


def test_bad_input_is_a_clear_error(sb: Sandbox) -> None:
    def refused(**fields: Any) -> dict[str, Any]:
        reply = sb.request({"action": {"type": "run_code", "code": "1", **fields}})
        assert reply["ok"] is False, reply
        error: dict[str, Any] = reply["error"]
        return error

    assert refused(language="cobol")["field"] == "action.language"
    assert refused(context="../x") == {**refused(context="../x"), "code": "invalid_field", "field": "action.context"}
    assert refused(timeout_ms=10_000_000)["field"] == "action.timeout_ms"
    assert refused(max_output_bytes=1 << 30)["field"] == "action.max_output_bytes"
    assert json.dumps(run(sb, "1 + 1")["results"]) == json.dumps(
        [{"data": {"text/plain": "2"}, "is_main_result": True, "omitted": []}]
    )
