"""The SDK as a user of E2B would write it, through a real gateway and sandbox: ``async with
AsyncSandbox.create(...)`` (the session ends with the block), ``exec`` with a list (argv, no shell),
``files.read(..., format="text")``, and a write or an upload into a directory that does not exist
failing with the user's path, the missing directory and the option that makes it (never the
temporary file the write goes through)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import ActionFailed, AsyncSandbox, Sandbox
from corral.errors import CorralError, GatewayError

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "it-sdk-conv") as running:
        yield running


async def test_async_with_create_as_e2bs_and_the_session_ends_with_the_block(gw: RunningGateway) -> None:
    async with AsyncSandbox.create(url=gw.url, api_key=KEY_A) as sb:
        session_id = sb.id
        listed = await sb.exec(["ls", "-la", "/workspace"])
        assert listed.exit_code == 0 and listed.stdout.startswith("total ")
        # A list is argv: no shell reads it ($HOME stays as written).
        said = await sb.exec(["echo", "$HOME", "a b"])
        assert said.stdout == "$HOME a b\n"
        await sb.files.write("notes/é.txt", "héllo\n", make_dirs=True)
        text = await sb.files.read("notes/é.txt", format="text")
        raw = await sb.files.read("notes/é.txt")
        assert (text, raw) == ("héllo\n", "héllo\n".encode())
    with gw.client(KEY_A) as api:
        assert api.get(f"/v1/sessions/{session_id}").status_code == 404
    # `async with await`, the old form, still works.
    async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A) as again:
        assert (await again.exec("echo $((6 * 7))")).stdout == "42\n"


def test_a_write_into_a_missing_directory_names_the_path_and_make_dirs(gw: RunningGateway, tmp_path: Path) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        with pytest.raises(ActionFailed) as refused:
            sb.files.write("/workspace/up/x.txt", "x")
        error = refused.value.error
        assert error["code"] == "no_such_file"
        assert error["message"] == (
            "'/workspace/up/x.txt': its directory /workspace/up does not exist (make_dirs makes it)"
        )
        assert ".corral-write" not in str(refused.value)
        local = tmp_path / "report.txt"
        local.write_text("r")
        with pytest.raises(GatewayError) as upload:
            sb.files.upload(local, "/workspace/up/report.txt")
        assert upload.value.code == "no_such_file" and ".corral-write" not in str(upload.value)
        assert "its directory /workspace/up does not exist (make_dirs makes it)" in str(upload.value)
        # A directory the agent may not write: the path and the directory, never the temporary file.
        with pytest.raises(ActionFailed) as denied:
            sb.files.write("/etc/corral-x", "x")
        assert (denied.value.error["code"], denied.value.error["message"]) == (
            "permission_denied",
            "'/etc/corral-x': its directory /etc: Read-only file system",
        )
        sb.files.upload(local, "/workspace/up/report.txt", make_dirs=True)
        assert sb.files.read("/workspace/up/report.txt", format="text") == "r"
        sb.files.write("bin.dat", b"\xff\xfe")
        with pytest.raises(CorralError) as not_text:
            sb.files.read("bin.dat", format="text")
        assert (
            str(not_text.value)
            == "bin.dat is not UTF-8 text (byte 0 of what was read is not): read it with format='bytes'"
        )
