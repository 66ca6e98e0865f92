"""Recorded responses uploaded for hermetic replays (``POST /v1/replay-responses``).

Each upload is a recording's ``responses.mitm`` (a mitmproxy flow file), kept under
``<data_dir>/replay-responses/<id>.mitm`` with its owner beside it, checked and cut to its last
complete flow. A hermetic session copies it into its proxy's state, so an upload can serve several
replays and be deleted at any time; uploads older than the retention are pruned.
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
from pathlib import Path

from corral.errors import ReplayNotFound
from corral.gateway.store import open_private, private_dir, write_private
from corral.proxy.flowfile import FlowFile, check

ID_PREFIX = "rsp_"
SUFFIX = ".mitm"
OWNER_SUFFIX = ".owner"


class ReplayUploads:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def _path(self, upload_id: str) -> Path:
        if not (upload_id.startswith(ID_PREFIX) and len(upload_id) == 20 and upload_id[4:].isalnum()):
            raise ValueError(f"not a replay-responses id: {upload_id!r}")
        return self.root / f"{upload_id}{SUFFIX}"

    def begin(self) -> tuple[str, Path]:
        """A new id and the temporary file its bytes go to (made here, 0600: whoever opens it to
        write keeps that mode)."""
        private_dir(self.root)
        upload_id = ID_PREFIX + secrets.token_hex(8)
        part = self.root / f".{upload_id}.part"
        os.close(open_private(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        return upload_id, part

    def finish(self, upload_id: str, part: Path, owner: str) -> FlowFile:
        """Check the uploaded bytes, cut a torn last flow, and keep it; raises ValueError (and removes
        the part) when it is no flow file."""
        try:
            size = part.stat().st_size
            if size:
                with (
                    part.open("rb") as stream,
                    mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data,
                    memoryview(data) as view,  # released before the map closes
                ):
                    checked = check(view)
            else:
                checked = check(b"")
            if checked.torn:
                os.truncate(part, checked.complete)
            os.replace(part, self._path(upload_id))
            write_private(self.root / f"{upload_id}{OWNER_SUFFIX}", owner)  # after: never an owner of nothing
        finally:
            part.unlink(missing_ok=True)
        return checked

    def path_for(self, upload_id: str, owner: str) -> Path:
        """The upload's file, if this owner made it; raises ReplayNotFound otherwise (no existence leak)."""
        path = self._path(upload_id)
        try:
            made_by = (self.root / f"{upload_id}{OWNER_SUFFIX}").read_text().strip()
        except OSError:
            made_by = None
        if made_by != owner or not path.exists():
            raise ReplayNotFound(f"no replay responses {upload_id}")
        return path

    def delete(self, upload_id: str, owner: str) -> None:
        """Remove this owner's upload; ReplayNotFound for any other id (malformed, another key's, gone)."""
        try:
            path = self.path_for(upload_id, owner)
        except (ReplayNotFound, ValueError):
            missing = ReplayNotFound(f"no replay responses {upload_id}")
            missing.field = None  # the id is in the path here, not a session's ``hermetic``
            raise missing from None
        path.unlink(missing_ok=True)
        (self.root / f"{upload_id}{OWNER_SUFFIX}").unlink(missing_ok=True)

    def prune(self, retention_s: float) -> int:
        removed, cutoff = 0, time.time() - retention_s
        for path in [*self.root.glob(f"{ID_PREFIX}*{SUFFIX}"), *self.root.glob(f".{ID_PREFIX}*.part")]:
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
                    path.with_suffix(OWNER_SUFFIX).unlink(missing_ok=True)
                    removed += 1
            except OSError:
                continue
        return removed
