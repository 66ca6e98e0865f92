"""Commands and files through the real gateway, with the SDK and the CLI: streamed output sorted to its
command while other requests go on, background processes, file actions, uploads and downloads through
the gateway's HTTP routes (big ones too; over the cap: 413 and nothing written), directories both ways."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CommandFailed, GatewayError
from corral.sdk import AsyncSandbox, Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image")

CAP = 210 << 20  # the gateway's upload cap here: a 200 MiB file fits, 211 MiB does not
MiB = 1 << 20


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-files", egress=False, max_upload_bytes=CAP) as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sandbox:
        yield sandbox


def _leftovers(runtime: DockerHarness, sb: Sandbox, directory: str) -> list[str]:
    """Temporary files the controller's writes leave in ``directory`` (none, when all went well)."""
    code, out = runtime.exec(sb.container, ["ls", "-A", directory], user="agent")
    assert code == 0, out
    return [name for name in out.split() if name.startswith(".corral-write-")]


def _write_random(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    block = os.urandom(MiB)
    with path.open("wb") as out:
        for _ in range(size // MiB):
            out.write(block)
            digest.update(block)
    return digest.hexdigest()


def test_exec_exit_codes_and_separate_streams(sb: Sandbox) -> None:
    result = sb.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (7, "out\n", "err\n", False)
    with pytest.raises(CommandFailed, match="exited 7"):
        result.check()
    assert sb.exec(argv=["id", "-un"]).check().stdout == "agent\n"
    assert sb.exec("exit 127").exit_code == 127  # bash's own code is a result
    with pytest.raises(ActionFailed) as missing:
        sb.exec(argv=["no-such-program-here"])
    assert (missing.value.code, missing.value.field) == ("program_not_found", "action.argv")
    timed = sb.exec("sleep 30", timeout_ms=300)
    assert (timed.timed_out, timed.signal, timed.exit_status()) == (True, "SIGKILL", 124)


def test_exec_stream_sorts_output_to_its_command_while_other_requests_go_on(sb: Sandbox) -> None:
    stream = sb.exec_stream("echo first; sleep 1; echo second >&2; echo third")
    items = iter(stream)
    first = next(items)
    assert first == OutputChunk("stdout", "first\n")
    # The command sleeps: the same connection answers a screenshot and a file action meanwhile.
    assert sb.screenshot("jpeg").startswith(b"\xff\xd8")
    assert sb.files.write("/workspace/meanwhile.txt", "x").size == 1
    rest = list(items)
    assert isinstance(rest[-1], ExecResult) and rest[-1].exit_code == 0
    chunks = [item for item in rest if isinstance(item, OutputChunk)]
    assert "".join(c.data for c in chunks if c.stream == "stderr") == "second\n"
    assert "".join(c.data for c in chunks if c.stream == "stdout") == "third\n"
    assert stream.result == rest[-1]


def test_background_process_with_stdin_output_and_wait(sb: Sandbox) -> None:
    pid = sb.processes.start(argv=["cat"])
    assert pid in [p.pid for p in sb.processes.list()]
    assert sb.processes.write(pid, b"hello\n", eof=True) == 6
    ended = sb.processes.wait(pid, timeout_ms=10_000)
    assert (ended.exit_code, ended.running) == (0, False)
    assert sb.processes.output(pid).data == "hello\n"
    sleeper = sb.processes.start("sleep 600")
    assert sb.processes.wait(sleeper, timeout_ms=100).running is True
    sb.processes.kill(sleeper)
    assert sb.processes.wait(sleeper, timeout_ms=10_000).signal == "SIGKILL"


def test_file_actions_through_the_sdk(sb: Sandbox) -> None:
    written = sb.files.write("/workspace/d/a.bin", b"\x00\xffdata", make_dirs=True)
    assert written.size == 6 and written.sha256 == hashlib.sha256(b"\x00\xffdata").hexdigest()
    assert sb.files.read("/workspace/d/a.bin") == b"\x00\xffdata"
    assert sb.files.stat("/workspace/d/a.bin").type == "file"
    sb.files.move("/workspace/d/a.bin", "/workspace/d/b.bin")
    assert [e.name for e in sb.files.list("/workspace/d").entries] == ["b.bin"]
    sb.files.remove("/workspace/d", recursive=True)
    with pytest.raises(ActionFailed) as gone:
        sb.files.stat("/workspace/d")
    assert gone.value.code == "no_such_file"


def test_upload_and_download_through_the_gateway(sb: Sandbox, tmp_path: Path) -> None:
    local = tmp_path / "blob.bin"
    digest = _write_random(local, 3 * MiB)
    [written] = sb.files.upload(local, "/workspace/up/blob.bin", make_dirs=True)
    assert (written.size, written.sha256) == (3 * MiB, digest)
    back = sb.files.download("/workspace/up/blob.bin", tmp_path / "back.bin")
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    with pytest.raises(GatewayError) as missing:
        sb.files.download("/workspace/nope", tmp_path / "nope")
    assert (missing.value.status, missing.value.code) == (404, "no_such_file")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(GatewayError) as denied:
        sb.files.upload(local, "/run/corral/x")
    assert (denied.value.status, denied.value.code) == (403, "permission_denied")


def test_a_directory_goes_up_file_by_file_and_comes_down_as_a_tar(sb: Sandbox, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "main.py").write_text("print('hi')\n")
    (tree / "pkg" / "data.bin").write_bytes(os.urandom(4096))
    written = sb.files.upload(tree, "/workspace/tree")
    assert sorted(w.path for w in written) == ["/workspace/tree/main.py", "/workspace/tree/pkg/data.bin"]
    assert sb.exec("python3 main.py", cwd="/workspace/tree").check().stdout == "hi\n"
    out = sb.files.download("/workspace/tree", tmp_path / "out")
    assert (out / "main.py").read_text() == "print('hi')\n"
    assert (out / "pkg" / "data.bin").read_bytes() == (tree / "pkg" / "data.bin").read_bytes()


def _declared_put(gw: RunningGateway, path: str, length: int) -> tuple[int, bytes]:
    """A PUT that declares ``length`` bytes and sends none (httpx will not send a short body): the
    gateway's status and answer."""
    host, port = gw.url.removeprefix("http://").split(":")
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY_A}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head.encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


def test_an_upload_over_the_cap_is_413_with_nothing_written(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    where = f"/v1/sessions/{sb.id}/files"
    # Declared too large: refused at once, before a byte of the body was taken or the sandbox asked.
    status, body = _declared_put(gw, f"{where}?path=/workspace/too-big", CAP + 1)
    assert status == 413 and b'"too_large"' in body

    def pieces() -> Iterator[bytes]:
        block = b"\0" * MiB
        for _ in range((CAP >> 20) + 1):
            yield block

    # Chunked, no length: cut off the moment it passes the cap.
    with gw.client() as http:
        streamed = http.put(where, params={"path": "/workspace/too-big"}, content=pieces())
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "too_large"
    with pytest.raises(ActionFailed) as absent:
        sb.files.stat("/workspace/too-big")
    assert absent.value.code == "no_such_file"
    deadline = time.monotonic() + 10  # the controller removes its temporary file once the cut reaches it
    while (left := _leftovers(runtime, sb, "/workspace")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    assert sb.exec("true").exit_code == 0  # the session carries on


def test_200_mib_up_and_down_through_the_gateway(sb: Sandbox, tmp_path: Path) -> None:
    local = tmp_path / "big.bin"
    digest = _write_random(local, 200 * MiB)
    [written] = sb.files.upload(local, "/workspace/big.bin")
    assert (written.size, written.sha256) == (200 * MiB, digest)
    local.unlink()
    back = sb.files.download("/workspace/big.bin", tmp_path / "back.bin")
    assert back.stat().st_size == 200 * MiB
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    sb.files.remove("/workspace/big.bin")


def test_cli_exec_and_cp(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli import app

    runner = CliRunner()
    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A}
    ran = runner.invoke(app, ["exec", sb.id, "--", "sh", "-c", "printf 'a\\377'; echo err >&2; exit 5"], env=env)
    assert (ran.exit_code, ran.stdout_bytes, ran.stderr_bytes) == (5, b"a\xff", b"err\n")
    timed = runner.invoke(app, ["exec", sb.id, "--sh", "sleep 30", "--timeout", "0.3"], env=env)
    assert timed.exit_code == 124
    missing = runner.invoke(app, ["exec", sb.id, "--", "no-such-program-here"], env=env)
    assert missing.exit_code == 127 and "program_not_found" in missing.stderr
    tree = tmp_path / "src"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("file")
    assert runner.invoke(app, ["cp", str(tree), f"{sb.id}:/workspace/cp"], env=env).exit_code == 0
    assert sb.files.read("/workspace/cp/sub/f.txt") == b"file"
    down = runner.invoke(app, ["cp", f"{sb.id}:/workspace/cp", str(tmp_path / "down")], env=env)
    assert down.exit_code == 0, down.output
    assert (tmp_path / "down" / "sub" / "f.txt").read_text() == "file"


async def test_the_async_sdk_streams_and_transfers(gw: RunningGateway, tmp_path: Path) -> None:
    sandbox = await AsyncSandbox.create(url=gw.url, api_key=KEY_A)
    async with sandbox as sb:
        stream = await sb.exec_stream(argv=["sh", "-c", "echo one; echo two >&2"])
        items = [item async for item in stream]
        assert isinstance(items[-1], ExecResult) and items[-1].exit_code == 0
        assert {(c.stream, c.data) for c in items[:-1] if isinstance(c, OutputChunk)} >= {("stdout", "one\n")}
        (tmp_path / "a.txt").write_text("async")
        await sb.files.upload(tmp_path / "a.txt", "/workspace/a.txt")
        assert (await sb.files.download("/workspace/a.txt", tmp_path / "b.txt")).read_text() == "async"
        assert (await sb.exec("cat /workspace/a.txt")).stdout == "async"


def test_a_downloaded_directory_keeps_files_and_directories_only(sb: Sandbox, tmp_path: Path) -> None:
    made = "mkdir -p /workspace/odd/sub && cd /workspace/odd && echo data > f && ln f sub/hard"
    sb.exec(f"{made} && ln -s /etc/passwd abs && ln -s f rel && ln -s .. up && mkfifo pipe").check()
    out = sb.files.download("/workspace/odd", tmp_path / "out")
    assert (out / "f").read_text() == (out / "sub" / "hard").read_text() == "data\n"
    # A link to the file made before it in the same fresh tree (a farm of them costs its size once),
    # never to anything outside it.
    assert (out / "sub" / "hard").stat().st_ino == (out / "f").stat().st_ino
    assert (out / "sub" / "hard").stat().st_nlink == 2
    assert sorted(p.name for p in out.iterdir()) == ["f", "sub"]  # links and the fifo left out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no tar, no scratch directory


def test_cp_of_a_file_to_a_remote_directory_puts_it_inside(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli import app

    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A}
    (tmp_path / "first.txt").write_text("1")
    (tmp_path / "second.txt").write_text("2")
    sb.exec("mkdir -p /workspace/into").check()
    for source, destination in (("first.txt", f"{sb.id}:"), ("second.txt", f"{sb.id}:/workspace/into")):
        ran = CliRunner().invoke(app, ["cp", str(tmp_path / source), destination], env=env)
        assert ran.exit_code == 0, ran.output
    assert sb.files.read("/workspace/first.txt") == b"1"
    assert sb.files.read("/workspace/into/second.txt") == b"2"


async def test_the_async_exec_stream_is_iterated_at_once(gw: RunningGateway) -> None:
    sandbox = await AsyncSandbox.create(url=gw.url, api_key=KEY_A)
    async with sandbox as sb:
        items = [item async for item in sb.exec_stream("printf out")]
        assert [c.data for c in items if isinstance(c, OutputChunk)] == ["out"]
        result = items[-1]
        assert isinstance(result, ExecResult) and result.exit_code == 0 and result.stdout == ""  # all in the chunks
