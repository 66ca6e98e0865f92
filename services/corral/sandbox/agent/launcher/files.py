"""The controller's side of the file operations done as the agent: :class:`LauncherFiles`, which
implements :class:`corral.sandbox.tools.agentfs.AgentFs` over the launcher's connection (the
launcher's side: :mod:`corral.sandbox.agent.launcher.fsops`)."""

from __future__ import annotations

import os

from corral.sandbox.agent.launcher import messages as m
from corral.sandbox.agent.launcher.connection import Connection
from corral.sandbox.tools.agentfs import DirEntry, FileStat


def _entry(obj: m.WireStat) -> DirEntry:
    path = os.fsdecode(m.unb64(obj["path"], "path"))
    target = obj.get("target")
    return DirEntry(
        name=os.path.basename(path),
        path=path,
        type=obj["type"],
        size=obj["size"],
        mode=obj["mode"],
        mtime=obj["mtime"],
        target=None if target is None else os.fsdecode(m.unb64(target, "target")),
    )


def _stat(obj: m.WireStat) -> FileStat:
    entry = _entry(obj)
    return FileStat(entry.name, entry.path, entry.type, entry.size, entry.mode, entry.mtime, entry.target)


class LauncherFiles:
    """AgentFs through the launcher: each call one request, answered with what :mod:`os` gave the
    agent, or its OSError (an ``open`` or ``mkstemp`` brings the descriptor itself: the data never
    passes through the launcher)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        _, fds = await self._connection.call("open", path=os.fsencode(path), flags=flags, mode=mode)
        return fds[0]

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> FileStat:
        reply, _ = await self._connection.call("stat", path=os.fsencode(path), follow_symlinks=follow_symlinks)
        return _stat(reply["stat"])

    async def scandir(self, path: str, limit: int) -> tuple[list[DirEntry], bool]:
        # One reply holds what fits a message; a big directory comes in several, each from where
        # the last one stopped (readdir's order holds while the directory does not change).
        entries: list[DirEntry] = []
        skip = 0
        while True:
            reply, _ = await self._connection.call(
                "scandir", path=os.fsencode(path), limit=limit - len(entries), skip=skip
            )
            entries += [_entry(entry) for entry in reply["entries"]]
            following = reply.get("next")
            if not isinstance(following, int) or len(entries) >= limit:
                return entries, bool(reply["truncated"]) or isinstance(following, int)
            skip = following

    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False) -> None:
        await self._connection.call("mkdir", path=os.fsencode(path), mode=mode, parents=parents)

    async def mkstemp(self, directory: str, prefix: str) -> tuple[int, str]:
        reply, fds = await self._connection.call(
            "mkstemp", directory=os.fsencode(directory), prefix=os.fsencode(prefix)
        )
        return fds[0], os.fsdecode(m.unb64(reply["path"], "path"))

    async def rename(self, source: str, destination: str, *, replace: bool = True) -> None:
        await self._connection.call(
            "rename", source=os.fsencode(source), destination=os.fsencode(destination), replace=replace
        )

    async def chmod(self, path: str, mode: int) -> None:
        await self._connection.call("chmod", path=os.fsencode(path), mode=mode)

    async def unlink(self, path: str) -> None:
        await self._connection.call("unlink", path=os.fsencode(path))

    async def rmdir(self, path: str) -> None:
        await self._connection.call("rmdir", path=os.fsencode(path))

    async def rmtree(self, path: str) -> None:
        await self._connection.call("rmtree", path=os.fsencode(path))
