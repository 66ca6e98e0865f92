"""Every session's Chromium has the same window frame, however late openbox comes up.

Chromium picks its frame once, at start, from the window manager it finds on the root window: its own
(tabs at the top) when openbox has announced itself, openbox's title bar above the tabs when none has.
A loaded host once started Chromium before openbox was up, and that session's screens were all 22
pixels lower than every other's (a recording made in one failed every step of its replay in another).

Played for real: every openbox this host starts during the test is stopped the moment it appears and
let go 1.5 s later, as two saturated cores delayed it. The init waits for openbox's announcement
before it starts Chromium (docs/design/0477); on the image before that, each such session had
openbox's frame (_NET_FRAME_EXTENTS 1, 1, 22, 5). Alone: the hold reaches every new openbox on the
host, another worker's sessions' too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sdk import Sandbox

from .conftest import wait_for
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = [pytest.mark.usefixtures("desktop_image", "egress_image"), pytest.mark.alone]

HOLD_S = 1.5
OPENBOX = b"/usr/bin/openbox\0"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "frame", pool_size=0) as served:
        yield served


@contextlib.contextmanager
def openbox_held_at_start(hold_s: float) -> Iterator[list[int]]:
    """Each openbox that starts meanwhile, stopped as soon as it shows and continued ``hold_s`` later;
    yields the pids held. Processes running before are left alone. A pid is read again until it is
    openbox (setpriv and env exec it in the same process)."""
    before = {name for name in os.listdir("/proc") if name.isdigit()}
    held: list[int] = []
    timers: list[threading.Timer] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for name in os.listdir("/proc"):
                if not name.isdigit() or name in before or int(name) in held:
                    continue
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{name}/cmdline").read_bytes().startswith(OPENBOX):
                        os.kill(int(name), signal.SIGSTOP)
                        held.append(int(name))
                        timers.append(threading.Timer(hold_s, _continue, args=(int(name),)))
                        timers[-1].start()
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield held
    finally:
        done.set()
        watcher.join()
        for timer in timers:
            timer.cancel()
        for pid in held:
            _continue(pid)


def _continue(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def frame_extents(runtime: DockerHarness, container: str) -> list[tuple[int, ...]]:
    """What openbox draws around each managed window (left, right, top, bottom), read as the browser's
    uid (a trusted X client by its uid)."""
    _, listed = runtime.exec(container, ["xprop", "-root", "_NET_CLIENT_LIST"], user="browser")
    windows = re.findall(r"0x[0-9a-f]+", listed.partition("#")[2])
    extents = []
    for window in windows:
        _, text = runtime.exec(container, ["xprop", "-id", window, "_NET_FRAME_EXTENTS"], user="browser")
        extents.append(tuple(int(n) for n in re.findall(r"\d+", text.partition("=")[2])))
    return extents


def test_chromium_keeps_its_own_frame_when_openbox_comes_up_late(gw: RunningGateway, runtime: DockerHarness) -> None:
    with openbox_held_at_start(HOLD_S) as held, Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.screenshot()
        assert held, "no openbox started during the test: nothing was played"
        # Read once openbox manages the window (a held openbox lists nothing until it is let go).
        extents = wait_for(lambda: frame_extents(runtime, sb.container), timeout_s=15)
    assert extents == [(0, 0, 0, 0)], extents  # one window, no title bar or border of openbox's
