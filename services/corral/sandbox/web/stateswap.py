"""The browser's state out of and into a running sandbox, run by the gateway (``docker exec`` as the
browser's uid, the only one that may read its profile): ``export`` writes the state's archive to
stdout, ``import`` reads one from stdin and puts it in place.

Both stop Chromium first, under an exclusive lock on :data:`LOCK_FILE` which the init takes shared
before it starts Chromium again (corral.sandbox.startup.init): an export by closing its windows (a
full shutdown, which commits its cookie store and local storage), an import with one SIGTERM (the
state it holds is being replaced). The files are never read or replaced under a running Chromium,
and the init brings it back onto the state once the lock is let go; the caller waits for Chromium
to start again (its ``SingletonLock``) before it answers. Exit codes: 0 done, 3 over the cap, 4 an
archive refused, 5 Chromium would not stop or start; the reason on stderr's last line.

Started with ``python -P``: nothing it imports comes from a writable place (the standard library,
corral.errors, python-xlib)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from corral.errors import BrowserStuck, StateRefused, StateTooLarge
from corral.sandbox.web.statearchive import KEPT, pack, unpack
from corral.sandbox.web.windowclose import close_windows

BROWSER_HOME = Path("/tmp/corral-browser")  # corral.sandbox.startup.boot.BROWSER_HOME
USER_DATA_DIR = BROWSER_HOME / "profile"  # corral.sandbox.startup.init's --user-data-dir
STAGING = BROWSER_HOME / "state.incoming"
LOCK_FILE = "/run/corral/browser.lock"  # boot makes it: the browser's, readable by the init's group
# Chromium's process singleton (a symbolic link to host-pid) made early in its start and removed at a
# clean exit: the sign a new Chromium runs on the profile (the gateway then waits for the controller
# to see DevTools answer: runtime.wait_ready). DevToolsActivePort is written only for port 0.
READY_FILE = "SingletonLock"
EXIT_TOO_LARGE, EXIT_REFUSED, EXIT_BROWSER = 3, 4, 5
STOP_WAIT_S = 15.0
CLOSE_WAIT_S = 10.0
START_WAIT_S = 30.0
_POLL_S = 0.05


def is_browser_main(argv: list[str]) -> bool:
    """Chromium's browser process (not a renderer, GPU or utility child, not the setpriv before it). Pure."""
    if not argv or Path(argv[0]).name not in ("chromium", "chrome"):
        return False
    return not any(arg.startswith("--type=") for arg in argv[1:])


def browser_pids() -> list[int]:
    """The browser processes of this uid that are alive (a zombie has exited)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and is_browser_main([arg.decode(errors="replace") for arg in argv if arg]):
            found.append(int(entry.name))
    return found


def quit_browser() -> None:
    """Chromium quit as a person quits it (its windows closed: a full shutdown that commits cookies and
    local storage), waited for up to ``CLOSE_WAIT_S``; what is left (no window, a page holding its
    window open with a beforeunload prompt) stopped by :func:`stop_browser`. Chromium runs on without
    a window (docs/design/0384): its last page gone while this holds the lock, the controller's page
    keeper sends it ``Browser.close`` (the same full shutdown), which this uid cannot reach."""
    pids = set(browser_pids())
    if pids and close_windows(pids):
        deadline = time.monotonic() + CLOSE_WAIT_S
        while set(browser_pids()) & pids and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    stop_browser()


def stop_browser() -> None:
    """SIGTERM to Chromium once (a second one during its shutdown kills it at once: Chromium puts the
    default action back after the first, and its cookie store would not be written), waited for;
    SIGKILL once ``STOP_WAIT_S`` passed. Two empty looks in a row: one the init started just before
    the lock was taken is stopped too."""
    deadline = time.monotonic() + STOP_WAIT_S
    asked: set[int] = set()
    quiet = 0
    while quiet < 2:
        pids = browser_pids()
        quiet = 0 if pids else quiet + 1
        late = time.monotonic() > deadline
        for pid in pids:
            if late or pid not in asked:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                asked.add(pid)
        if late and time.monotonic() > deadline + STOP_WAIT_S:
            raise BrowserStuck("Chromium did not stop")
        time.sleep(_POLL_S if pids else 0.1)


def wait_for_browser(user_data_dir: Path) -> None:
    """Chromium back (its process singleton made again), or :class:`BrowserStuck`."""
    deadline = time.monotonic() + START_WAIT_S
    while not os.path.lexists(user_data_dir / READY_FILE):
        if time.monotonic() > deadline:
            raise BrowserStuck(f"Chromium did not start again in {START_WAIT_S:.0f}s")
        time.sleep(_POLL_S)


def exclusive(lock_file: str) -> int:
    fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def export_state(user_data_dir: Path, max_bytes: int, lock_file: str) -> bytes:
    lock = exclusive(lock_file)
    try:
        quit_browser()
        (user_data_dir / READY_FILE).unlink(missing_ok=True)
        return pack(user_data_dir, max_bytes)
    finally:
        os.close(lock)  # the init starts Chromium again onto the same state


def import_state(data: bytes, user_data_dir: Path, staging: Path, max_bytes: int, lock_file: str) -> int:
    """The archive checked and written to ``staging`` while Chromium runs; then, with Chromium
    stopped, the profile's state swapped for it. The bytes of files put in place."""
    shutil.rmtree(staging, ignore_errors=True)
    try:
        written = unpack(data, staging, max_bytes)
        lock = exclusive(lock_file)
        try:
            stop_browser()  # the state it holds is about to be replaced: no need to commit it
            _swap(staging, user_data_dir)
            (user_data_dir / READY_FILE).unlink(missing_ok=True)
        finally:
            os.close(lock)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _swap(staging: Path, user_data_dir: Path) -> None:
    (user_data_dir / "Default").mkdir(mode=0o700, parents=True, exist_ok=True)
    for kept in KEPT:
        target = user_data_dir / kept
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        incoming = staging / kept
        if incoming.exists():
            incoming.rename(target)


def _read_stdin(max_bytes: int) -> bytes:
    data = sys.stdin.buffer.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StateTooLarge(f"the archive is over {max_bytes} bytes")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("export", "import") or not argv[1].isdigit():
        print("usage: stateswap export|import MAX_BYTES", file=sys.stderr)
        return 2
    verb, max_bytes = argv[0], int(argv[1])
    os.umask(0o077)
    try:
        if verb == "export":
            data = export_state(USER_DATA_DIR, max_bytes, LOCK_FILE)
            wait_for_browser(USER_DATA_DIR)
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            written = import_state(_read_stdin(max_bytes), USER_DATA_DIR, STAGING, max_bytes, LOCK_FILE)
            wait_for_browser(USER_DATA_DIR)
            print(written)
    except StateTooLarge as exc:
        print(exc, file=sys.stderr)
        return EXIT_TOO_LARGE
    except StateRefused as exc:
        print(exc, file=sys.stderr)
        return EXIT_REFUSED
    except BrowserStuck as exc:
        print(exc, file=sys.stderr)
        return EXIT_BROWSER
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
