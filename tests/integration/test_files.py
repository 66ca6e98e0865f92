"""Files inside the real sandbox, done as the agent's uid through the launcher: round trips over the
WebSocket and through PUT/GET /v1/files, an all-or-nothing write on a full disk, paths the agent may
not read, names that are not UTF-8, directories as tar, and a browser download found by file_list.
After every bad input the session carries on."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.client import SandboxClient
from corral.contracts import auth
from corral.errors import ActionFailed
from corral.runtime import SandboxAddress, SandboxSpec
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A

HOME = "/home/agent"
RAW = {"content-type": "application/octet-stream"}


def _owner(runtime: DockerHarness, box: SandboxAddress, path: str) -> str:
    # As the agent: each home is 0700 and root here holds no DAC capability.
    code, out = runtime.exec(box.id, ["stat", "-c", "%U %a", path], user="agent")
    assert code == 0, out
    return out.strip()


def _temp_files(runtime: DockerHarness, box: SandboxAddress, directory: str) -> list[str]:
    code, out = runtime.exec(box.id, ["ls", "-A", directory], user="agent")
    assert code == 0, out
    return [name for name in out.split() if name.startswith(".corral-write-")]


def _http(box: SandboxAddress) -> httpx.Client:
    return httpx.Client(base_url=box.base_url, timeout=120)


def _put(box: SandboxAddress, params: dict[str, str], body: Any) -> httpx.Response:
    with _http(box) as http:
        return http.put("/v1/files", params=params, content=body, headers=auth.sign(box.secret).headers | RAW)


def _get(box: SandboxAddress, params: dict[str, str]) -> httpx.Response:
    with _http(box) as http:
        return http.get("/v1/files", params=params, headers=auth.sign(box.secret).headers)


def _failed(client: SandboxClient, action: dict[str, Any]) -> dict[str, Any]:
    reply = client.request({"action": action})
    assert reply["ok"] is False, reply
    error: dict[str, Any] = reply["error"]
    return error


def _still_working(client: SandboxClient) -> None:
    assert client.act({"type": "file_stat", "path": HOME})["result"]["type"] == "directory"
    assert len(client.screenshot("jpeg")) > 1000


def test_text_and_binary_round_trips_as_the_agent(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness
) -> None:
    path = f"{HOME}/notes/día.txt"
    written = client.act({"type": "file_write", "path": path, "content": "héllo\nwörld\n", "make_dirs": True})
    data = "héllo\nwörld\n".encode()
    assert written["result"] == {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert _owner(runtime, sandbox, path) == "agent 644"  # the agent's file, made by the agent's uid
    assert _owner(runtime, sandbox, f"{HOME}/notes") == "agent 755"
    read = client.act({"type": "file_read", "path": path})["result"]
    assert (read["content"], read["size"], read["eof"]) == ("héllo\nwörld\n", len(data), True)

    blob = bytes(range(256)) * 16
    encoded = base64.b64encode(blob).decode()
    client.act({"type": "file_write", "path": f"{HOME}/blob.bin", "content_base64": encoded, "mode": "0600"})
    assert _owner(runtime, sandbox, f"{HOME}/blob.bin") == "agent 600"
    back = client.act({"type": "file_read", "path": f"{HOME}/blob.bin", "encoding": "base64"})["result"]
    assert base64.b64decode(back["content"]) == blob
    window = client.act({"type": "file_read", "path": f"{HOME}/blob.bin", "encoding": "base64", "offset": 255})
    assert base64.b64decode(window["result"]["content"])[:2] == b"\xff\x00"
    error = _failed(client, {"type": "file_read", "path": f"{HOME}/blob.bin"})  # not UTF-8: never mangled
    assert (error["code"], error["field"]) == ("invalid_request", "action.encoding")

    appended = client.act({"type": "file_write", "path": path, "content": "again\n", "append": True})["result"]
    assert appended["size"] == len(data) + 6
    stat = client.act({"type": "file_stat", "path": path})["result"]
    assert (stat["type"], stat["size"], stat["mode"], stat["name"]) == ("file", len(data) + 6, "0644", "día.txt")
    assert _temp_files(runtime, sandbox, f"{HOME}/notes") == []
    _still_working(client)


def test_large_files_through_put_and_get(sandbox: SandboxAddress, client: SandboxClient) -> None:
    size = 48 << 20
    block = hashlib.sha512(b"corral").digest() * 16384  # 1 MiB that does not compress to nothing
    digest = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for index in range(size // len(block)):
            chunk = index.to_bytes(8, "big") + block[8:]
            digest.update(chunk)
            yield chunk

    path = f"{HOME}/big/upload.bin"
    started = time.monotonic()
    put = _put(sandbox, {"path": path, "make_dirs": "1"}, body())
    assert put.status_code == 200, put.text
    assert put.json() == {"ok": True, "path": path, "size": size, "sha256": digest.hexdigest()}
    assert auth.proven(sandbox.secret, put.request.headers[auth.AUTH_HEADER].split(".")[2], put.headers)

    got = hashlib.sha256()
    received = 0
    with (
        _http(sandbox) as http,
        http.stream("GET", "/v1/files", params={"path": path}, headers=auth.sign(sandbox.secret).headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-length"] == str(size)
        for chunk in response.iter_bytes():
            got.update(chunk)
            received += len(chunk)
    assert (received, got.hexdigest()) == (size, digest.hexdigest())
    assert time.monotonic() - started < 60
    assert client.act({"type": "file_remove", "path": f"{HOME}/big", "recursive": True})["ok"] is True
    _still_working(client)


@pytest.fixture
def small_disk(runtime: DockerHarness, desktop_image: str) -> Iterator[SandboxAddress]:
    """A sandbox whose /workspace is a 24 MiB tmpfs: easy to fill."""
    name = f"corral-it-files-full-{os.getpid()}"
    runtime.remove(name)
    spec = SandboxSpec(image=desktop_image, name=name, workspace_size="24m", labels={"corral.test": "1"})
    box = runtime.start_sandbox(spec)
    runtime.wait_ready(box, timeout_s=90)
    yield box
    runtime.remove(box.id)


def test_a_full_disk_leaves_nothing_half_written(small_disk: SandboxAddress, runtime: DockerHarness) -> None:
    box = small_disk
    with SandboxClient(box.ws_url, controller_secret=box.secret) as client:
        client.act({"type": "file_write", "path": "keep.txt", "content": "the old content"})  # in /workspace
        # More than the whole disk, streamed: the temporary file fills it and is removed.
        put = _put(box, {"path": "keep.txt"}, (b"x" * (1 << 20) for _ in range(40)))
        assert put.status_code == 507, put.text
        assert put.json()["error"]["code"] == "no_space" and put.json()["error"]["field"] == "path"
        assert client.act({"type": "file_read", "path": "keep.txt"})["result"]["content"] == "the old content"
        assert _temp_files(runtime, box, "/workspace") == []
        # The disk filled by the agent itself, then a write: the same, over the WebSocket.
        fill = ["sh", "-c", "head -c 100M /dev/zero > /workspace/filler; true"]
        code, out = runtime.exec(box.id, fill, user="agent")
        assert code == 0, out
        error = _failed(client, {"type": "file_write", "path": "keep.txt", "content": "y" * 500_000})
        assert (error["code"], error["field"]) == ("no_space", "action.path")
        assert client.act({"type": "file_read", "path": "keep.txt"})["result"]["content"] == "the old content"
        assert _temp_files(runtime, box, "/workspace") == []
        client.act({"type": "file_remove", "path": "filler"})
        client.act({"type": "file_write", "path": "keep.txt", "content": "new"})
        assert client.act({"type": "file_read", "path": "/workspace/keep.txt"})["result"]["content"] == "new"
        _still_working(client)


def test_relative_paths_are_in_the_workspace(client: SandboxClient, runtime: DockerHarness) -> None:
    written = client.act({"type": "file_write", "path": "rel/dir/f.txt", "content": "w", "make_dirs": True})
    assert written["result"]["path"] == "/workspace/rel/dir/f.txt"
    listed = client.act({"type": "file_list", "path": "rel", "recursive": True})["result"]
    assert listed["path"] == "/workspace/rel"
    assert [entry["path"] for entry in listed["entries"]] == ["/workspace/rel/dir", "/workspace/rel/dir/f.txt"]
    # /workspace and the home are two filesystems: a move between them copies, then removes.
    moved = client.act({"type": "file_move", "source": "rel/dir/f.txt", "destination": f"{HOME}/f.txt"})
    assert moved["result"] == {"source": "/workspace/rel/dir/f.txt", "destination": f"{HOME}/f.txt"}
    assert client.act({"type": "file_read", "path": f"{HOME}/f.txt"})["result"]["content"] == "w"
    assert client.act({"type": "file_remove", "path": "rel", "recursive": True})["result"]["type"] == "directory"
    _still_working(client)


def _launcher_pid(runtime: DockerHarness, box: SandboxAddress) -> str:
    code, out = runtime.exec(box.id, ["pgrep", "-o", "-f", "corral.sandbox.agent.launcher"])
    assert code == 0, out
    return out.strip()


def test_a_directory_of_5000_entries_is_listed_whole_and_the_launcher_lives_on(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness
) -> None:
    # One launcher reply holds about a thousand entries: the rest come in further replies.
    before = _launcher_pid(runtime, sandbox)
    made = client.act(
        {"type": "exec", "command": "mkdir -p many && cd many && touch entry-{00001..05000}-with-a-longer-name.txt"}
    )
    assert made["result"]["exit_code"] == 0, made
    listed = client.act({"type": "file_list", "path": "many", "limit": 10000})["result"]
    names = [entry["name"] for entry in listed["entries"]]
    assert (len(set(names)), listed["truncated"]) == (5000, False)
    cut = client.act({"type": "file_list", "path": "many", "limit": 4000})["result"]
    assert (len(cut["entries"]), cut["truncated"]) == (4000, True)
    assert _launcher_pid(runtime, sandbox) == before
    assert client.act({"type": "file_remove", "path": "many", "recursive": True})["result"]["type"] == "directory"
    _still_working(client)


@pytest.mark.parametrize(
    ("action", "code"),
    [
        ({"type": "file_read", "path": "/run/corral/controller/secret"}, "permission_denied"),
        ({"type": "file_list", "path": "/run/corral/controller"}, "permission_denied"),
        ({"type": "file_stat", "path": "/run/corral/controller/secret"}, "permission_denied"),
        ({"type": "file_write", "path": "/home/corral/planted", "content": "x"}, "permission_denied"),
        ({"type": "file_write", "path": "/etc/planted", "content": "x"}, "permission_denied"),
        ({"type": "file_remove", "path": "/run/corral/launcher", "recursive": True}, "permission_denied"),
        ({"type": "file_read", "path": "/nowhere/at/all"}, "no_such_file"),
        ({"type": "file_list", "path": "/etc/hostname"}, "not_a_directory"),
        ({"type": "file_read", "path": HOME}, "is_a_directory"),
        ({"type": "file_read", "path": "/dev/zero"}, "invalid_request"),
        # /proc/self there is the launcher, which holds privilege: its memory map, its descriptors.
        ({"type": "file_read", "path": "/proc/self/maps"}, "permission_denied"),
        ({"type": "file_list", "path": "/proc/self/fd"}, "permission_denied"),
        ({"type": "file_read", "path": "/workspace/../proc/self/cmdline"}, "permission_denied"),
    ],
)
def test_what_the_agent_may_not_do_is_refused_and_the_session_carries_on(
    client: SandboxClient, action: dict[str, Any], code: str
) -> None:
    error = _failed(client, action)
    assert (error["code"], error["field"]) == (code, "action.path"), error
    _still_working(client)


def test_a_link_into_proc_is_refused(client: SandboxClient) -> None:
    reply = client.act({"type": "exec", "argv": ["ln", "-sfn", "/proc/self", "/workspace/me"]})
    assert reply["result"]["exit_code"] == 0, reply
    error = _failed(client, {"type": "file_read", "path": "/workspace/me/status"})
    assert (error["code"], error["field"]) == ("permission_denied", "action.path"), error
    _still_working(client)


# The agent's side of the race: /workspace/race/d flips between a link to a real directory and a link to
# /proc/self (the launcher, when the launcher resolves it), as fast as renames go, for at most 120 s.
SWAPPER = r"""
import os, time
os.chdir("/workspace/race")
end = time.monotonic() + 120
while time.monotonic() < end and not os.path.exists("stop"):
    for target, name in (("real", "d.real"), ("/proc/self", "d.proc")):
        try:
            os.symlink(target, name)
        except FileExistsError:
            pass
        os.replace(name, "d")
"""


def test_a_link_swapped_into_proc_between_the_check_and_the_use_is_refused(client: SandboxClient) -> None:
    """The launcher checked a path for /proc, then opened it: a link swapped in between led a file
    action into the launcher's own /proc/self (its command line here, its memory and descriptors as well)."""
    made = client.act({"type": "exec", "command": "mkdir -p /workspace/race/real/fd && rm -f /workspace/race/stop"})
    assert made["result"]["exit_code"] == 0, made
    client.act({"type": "file_write", "path": "/workspace/race/real/cmdline", "content": "benign"})
    client.act({"type": "file_write", "path": "/workspace/race/swap.py", "content": SWAPPER})
    swap = "cd /workspace/race && (setsid nohup python3 swap.py >/dev/null 2>&1 &)"
    started = client.act({"type": "exec", "command": swap})
    assert started["result"]["exit_code"] == 0, started
    outcomes: dict[str, int] = {}
    leaked: list[Any] = []
    try:
        for attempt in range(1500):
            action: dict[str, Any] = (
                {"type": "file_read", "path": "/workspace/race/d/cmdline"}
                if attempt % 3 == 0
                else {"type": "file_list", "path": "/workspace/race/d/fd"}
                if attempt % 3 == 1
                else {"type": "file_stat", "path": "/workspace/race/d/cmdline"}
            )
            reply = client.request({"action": action})
            if not reply["ok"]:
                key = f"{action['type']}:{reply['error']['code']}"
            elif action["type"] == "file_read":
                content = reply["result"]["content"]
                key = f"file_read:{content[:20]}"
                if content != "benign":
                    leaked.append(content[:200])
            elif action["type"] == "file_list":
                entries = reply["result"]["entries"]
                key = f"file_list:{len(entries)}"
                if entries:  # the real fd directory is empty; the launcher's is not
                    leaked.append([e["path"] for e in entries][:5])
            else:
                key = f"file_stat:{reply['result']['size']}"
                if reply["result"]["size"] != len("benign"):
                    leaked.append(reply["result"])
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        client.act({"type": "exec", "command": "touch /workspace/race/stop"})
    assert not leaked, (leaked[:5], outcomes)
    # The race was played: both sides of the flip were seen (read, and refused or not found).
    assert outcomes.get("file_read:benign", 0) > 0 and len(outcomes) > 3, outcomes
    _still_working(client)


def test_bad_paths_over_http(sandbox: SandboxAddress, client: SandboxClient) -> None:
    secret = _get(sandbox, {"path": "/run/corral/controller/secret"})
    assert secret.status_code == 403 and secret.json()["error"]["code"] == "permission_denied"
    assert _get(sandbox, {"path": "/run/corral/launcher"}).status_code == 403  # a directory: no tar of it either
    assert _get(sandbox, {"path": "/nowhere"}).status_code == 404
    assert _put(sandbox, {"path": "/home/corral/x"}, b"x").status_code == 403
    nul = _put(sandbox, {"path": "/tmp/a\x00b"}, b"x")
    assert nul.status_code == 400 and nul.json()["error"] == {
        "code": "invalid_field",
        "message": "a path cannot hold a NUL byte",
        "field": "path",
    }
    with _http(sandbox) as http:  # the door still wants the raw type on this route alone
        signed = auth.sign(sandbox.secret).headers
        typed = http.put("/v1/files", params={"path": "/tmp/a"}, content=b"x", headers=signed)
    assert typed.status_code == 415
    _still_working(client)


def test_nul_bytes_and_lone_surrogates_are_invalid_fields(client: SandboxClient) -> None:
    for path in ("/tmp/a\x00b", "/tmp/\ud800"):
        error = _failed(client, {"type": "file_write", "path": path, "content": "x"})
        assert (error["code"], error["field"]) == ("invalid_field", "action.path")
    error = _failed(client, {"type": "file_move", "source": "/tmp/x", "destination": "\x00"})
    assert (error["code"], error["field"]) == ("invalid_field", "action.destination")
    _still_working(client)


def test_names_that_are_not_utf8(client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness) -> None:
    directory = f"{HOME}/latin"
    client.act({"type": "file_write", "path": f"{directory}/keep", "content": "", "make_dirs": True})
    # A name the agent's own program made, in Latin-1.
    code, out = runtime.exec(sandbox.id, ["sh", "-c", f"printf latin > '{directory}/caf'$(printf '\\351')"], "agent")
    assert code == 0, out
    listed = client.act({"type": "file_list", "path": directory})["result"]
    odd = [entry for entry in listed["entries"] if "name_base64" in entry]
    assert len(odd) == 1 and base64.b64decode(odd[0]["name_base64"]) == b"caf\xe9"
    assert odd[0]["name"] == "caf\ufffd"
    read = client.act({"type": "file_read", "path_base64": odd[0]["path_base64"]})["result"]
    assert read["content"] == "latin"
    # Back through PUT/GET by their bytes.
    raw = base64.b64encode(os.fsencode(directory) + b"/na\xefve.bin").decode()
    assert _put(sandbox, {"path_base64": raw}, b"\x00\x01").json()["path_base64"] == raw
    assert _get(sandbox, {"path_base64": raw}).content == b"\x00\x01"
    moved = client.act({"type": "file_move", "source_base64": raw, "destination": f"{directory}/naive.bin"})
    assert moved["result"]["destination"] == f"{directory}/naive.bin"
    _still_working(client)


def test_a_directory_comes_as_a_tar_made_by_the_agent(client: SandboxClient, sandbox: SandboxAddress) -> None:
    root = f"{HOME}/proj"
    client.act({"type": "file_write", "path": f"{root}/src/main.py", "content": "print(1)\n", "make_dirs": True})
    client.act({"type": "file_write", "path": f"{root}/README", "content": "hi", "mode": 0o600})
    response = _get(sandbox, {"path": root})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        members = {member.name: member for member in archive.getmembers()}
        main = archive.extractfile("./src/main.py")
        assert main is not None and main.read() == b"print(1)\n"
    assert {"./README", "./src", "./src/main.py"} <= set(members)
    assert members["./README"].uname == "agent" and members["./README"].mode & 0o777 == 0o600
    _still_working(client)


def test_remove_and_move(client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness) -> None:
    root = f"{HOME}/moves"
    client.act({"type": "file_write", "path": f"{root}/a.txt", "content": "A", "make_dirs": True})
    client.act({"type": "file_write", "path": f"{root}/b.txt", "content": "B"})
    error = _failed(client, {"type": "file_move", "source": f"{root}/a.txt", "destination": f"{root}/b.txt"})
    assert (error["code"], error["field"]) == ("file_exists", "action.destination")
    client.act({"type": "file_move", "source": f"{root}/a.txt", "destination": f"{root}/b.txt", "overwrite": True})
    assert client.act({"type": "file_read", "path": f"{root}/b.txt"})["result"]["content"] == "A"
    # /tmp and the home are two filesystems: the file is copied whole, then removed.
    client.act({"type": "file_move", "source": f"{root}/b.txt", "destination": "/tmp/b-moved.txt"})
    assert client.act({"type": "file_read", "path": "/tmp/b-moved.txt"})["result"]["content"] == "A"
    assert _failed(client, {"type": "file_stat", "path": f"{root}/b.txt"})["code"] == "no_such_file"
    assert _owner(runtime, sandbox, "/tmp/b-moved.txt") == "agent 644"
    client.act({"type": "file_write", "path": f"{root}/deep/er/c.txt", "content": "C", "make_dirs": True})
    error = _failed(client, {"type": "file_remove", "path": f"{root}/deep"})
    assert (error["code"], error["field"]) == ("directory_not_empty", "action.path")
    assert client.act({"type": "file_remove", "path": root, "recursive": True})["result"]["type"] == "directory"
    assert _failed(client, {"type": "file_list", "path": root})["code"] == "no_such_file"
    listing = client.act({"type": "file_list", "path": HOME, "recursive": True, "pattern": "*.py", "limit": 5})
    assert all(entry["name"].endswith(".py") for entry in listing["result"]["entries"])
    _still_working(client)


# -- the browser's downloads ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-files-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.mark.usefixtures("desktop_image", "egress_image")
def test_a_browser_download_lands_in_downloads_and_file_list_finds_it(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream
) -> None:
    with (
        gateway_to(upstream, tmp_path_factory.mktemp("files-gw"), f"files-{os.getpid()}") as gw,
        Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb,
    ):
        sb.navigate("https://allowed.test/page/download.html")  # served through the session's proxy
        downloads = f"{HOME}/Downloads"
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(ActionFailed):  # no Downloads folder until the first download
                entries = sb.act({"type": "file_list", "path": downloads})["result"]["entries"]
                found = [entry for entry in entries if entry["name"] == "corral-report.bin"]
                if found:
                    break
            time.sleep(0.2)
        assert found, sb.act({"type": "file_list", "path": HOME})
        content = sb.act({"type": "file_read", "path": found[0]["path"]})["result"]["content"]
        assert content == "corral download corral-report.bin\n" * 64
        assert found[0]["size"] == len(content)
