"""``corral cp``: a file or a directory into a session or out of it, streamed through the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer

from corral import transfer
from corral.cli import common
from corral.errors import ActionFailed, CorralError, GatewayError
from corral.gateway_client import Gateway


def cp(
    source: Annotated[str, typer.Argument(help="A local path, or ID:/path in a session.")],
    destination: Annotated[str, typer.Argument(help="ID:/path in a session, or a local path.")],
    parents: Annotated[bool, typer.Option("--parents", "-p", help="Make missing directories in the session.")] = False,
) -> None:
    """Copy a file or a directory into a session or out of it (streamed through the gateway).

    `corral cp ./src ID:/workspace/src` uploads file by file; `corral cp ID:/workspace/out ./out`
    downloads a directory as a tar and unpacks it, letting nothing out of ./out."""
    remote_from, remote_to = transfer.Remote.parse(source), transfer.Remote.parse(destination)
    if (remote_from is None) == (remote_to is None):
        raise common.fail("one side is ID:/path in a session, the other a local path", 2)
    with common.gateway_call() as gateway:
        try:
            if remote_to is not None:
                _upload(gateway, Path(source), remote_to, parents)
            else:
                assert remote_from is not None
                _download(gateway, remote_from, Path(destination))
        except (OSError, CorralError) as exc:
            if isinstance(exc, GatewayError):
                raise
            raise common.fail(f"cannot copy: {exc}") from None


def _upload(gateway: Gateway, local: Path, remote: transfer.Remote, parents: bool) -> None:
    if not local.exists():
        raise common.fail(f"no such file: {local}", 2)
    into = remote.path
    if transfer.may_be_directory(local, into) and _remote_is_directory(remote.session_id, into):
        into += "/"  # `cp f ID:/workspace` puts f inside the directory, as cp does
    target = transfer.remote_target(local, into)
    plan = transfer.upload_plan(local, target)
    size = 0
    for path, into in plan:
        written = gateway.upload_file(remote.session_id, into, path, make_dirs=parents or local.is_dir())
        size += written.size
    common.console.print(
        f"uploaded {len(plan)} file{'s' * (len(plan) != 1)} ({size} bytes) to {remote.session_id}:{target}"
    )


def _left_out(names: list[str]) -> None:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    common.console.print(f"left out {len(names)} symbolic link(s), device(s) or fifo(s): {shown}")


def _remote_is_directory(session_id: str, path: str) -> bool:
    """Whether ``path`` in the session is a directory (``file_stat`` over its WebSocket); False when
    nothing is there yet."""
    with common.sandbox_client(session_id) as client:
        try:
            found = client.act({"type": "file_stat", "path": path})
        except ActionFailed as exc:
            if exc.code == "no_such_file":
                return False
            raise
    return bool(found["result"].get("type") == "directory")


def _download(gateway: Gateway, remote: transfer.Remote, local: Path) -> None:
    target = transfer.local_target(remote.path, local)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.corral-cp")
    try:
        got = gateway.download_file(remote.session_id, remote.path, part)
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:  # the gateway answered, then stopped
        raise CorralError(f"the download was cut short ({exc}); nothing was written") from None
    transfer.settle(got, target, _left_out)
    what = "directory" if got.is_tar else "file"
    common.console.print(f"downloaded {what} {remote.session_id}:{remote.path} to {target} ({got.size} bytes)")
