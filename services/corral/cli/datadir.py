"""The gateway's data dir on the host, made ready for ``corral up``'s compose gateway: it exists
(0700), and it is a shared mount, so that a workspace volume the gateway mounts under it inside its
container reaches the host's mount namespace, where the engine binds it into the sandbox (compose
binds it ``rshared``, which the engine refuses on a path under a private mount: docs/design/0330).
Under systemd ``/`` is shared already and nothing is done; elsewhere (a container, some init systems)
the data dir is bind-mounted onto itself and made ``rshared``, as root, once per boot."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from corral.errors import CorralError

DEFAULT_DATA_DIR = Path("/var/lib/corral")
# Where `up` notes a data dir it bound onto itself, so that `down` undoes that bind and no other
# mount (an operator's own disk at the data dir is never unmounted). /run: gone at reboot, as the bind.
MARKS = Path("/run/corral-shared-mounts")


def _mark(path: Path) -> Path:
    return MARKS / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]


def data_dir() -> Path:
    """``CORRAL_DATA_DIR`` as compose reads it (the shell's, or the env file's once loaded)."""
    return Path(os.environ.get("CORRAL_DATA_DIR") or DEFAULT_DATA_DIR)


def propagation(path: Path) -> str:
    """The propagation of the mount ``path`` is on (``shared``, ``private``, ``slave``, ...), as
    findmnt(8) reports it; CorralError when it cannot tell."""
    findmnt = shutil.which("findmnt")
    if findmnt is None:
        raise CorralError("findmnt (util-linux) is needed to check the data dir's mount")
    done = subprocess.run(
        [findmnt, "--noheadings", "--output", "PROPAGATION", "--target", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise CorralError(f"cannot read the mount of {path}: {done.stderr.strip() or 'findmnt said nothing'}")
    return done.stdout.split()[0]


def prepare(path: Path) -> list[str]:
    """``path`` made (0700) and a shared mount; what was done, in words (empty: nothing was needed).
    CorralError saying what to run when it is not shared and this process is not root."""
    done: list[str] = []
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True)
        done.append(f"made {path}")
    if propagation(path).startswith("shared"):
        return done
    if os.geteuid() != 0:
        raise CorralError(
            f"{path} is not on a shared mount, which workspace volumes need: as root, run "
            f"`mount --bind {path} {path} && mount --make-rshared {path}` (or `corral up` as root)"
        )
    _run(["mount", "--bind", str(path), str(path)])
    MARKS.mkdir(mode=0o700, exist_ok=True)
    _mark(path).write_text(str(path.resolve()))
    _run(["mount", "--make-rshared", str(path)])
    done.append(f"made {path} a shared mount (bound onto itself, rshared)")
    return done


def release(path: Path) -> list[str]:
    """What :func:`prepare` bound, unmounted again (with whatever is still mounted under it: a
    volume a removed sandbox left, which the next gateway's start detaches); nothing for a data dir
    it did not bind. A failure is said, never raised: the gateway is down already."""
    mark = _mark(path)
    if not mark.is_file():
        return []
    run = subprocess.run(["umount", "--recursive", str(path)], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        return [f"{path} stays bound onto itself: {run.stderr.strip()}"]
    mark.unlink()
    return [f"unbound {path}"]


def _run(argv: list[str]) -> None:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise CorralError(f"`{' '.join(argv)}` failed: {run.stderr.strip()}")
