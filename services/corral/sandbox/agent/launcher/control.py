"""The controller's end of one shepherd's control channel (:class:`Control`), and how a spawn came
out: :class:`Spawned` (the program runs) or :class:`SpawnRefused` (it never did)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from corral.sandbox.agent.launcher import messages as m


@dataclass(frozen=True, slots=True)
class SpawnRefused:
    """The program never ran: ``stage`` ("fork", "setup", "cwd" or "exec") failed with ``errno`` on
    ``path``."""

    stage: str
    errno: int
    path: str | None

    def error(self) -> OSError:
        return OSError(self.errno, os.strerror(self.errno), self.path)


class Control:
    """The controller's end of one shepherd's control channel: its events in order, and orders.
    ``on_exit`` is called once the main process exited (or the channel ended)."""

    def __init__(self, sock: socket.socket, on_exit: Callable[[], None] | None = None) -> None:
        self._sock = sock
        self._on_exit = on_exit
        sock.setblocking(False)
        self._events: asyncio.Queue[m.ShepherdEvent | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)
        self.closed = False

    def _readable(self) -> None:
        try:
            data = self._sock.recv(m.MAX_MESSAGE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self._sock.fileno())
            self._events.put_nowait(None)
            self._exited()
            return
        with contextlib.suppress(ValueError):  # a shepherd is the launcher's code: nothing else writes here
            event = m.parse_event(data)
            self._events.put_nowait(event)
            if event.kind in ("exited", "failed"):
                self._exited()

    def _exited(self) -> None:
        on_exit, self._on_exit = self._on_exit, None
        if on_exit is not None:
            on_exit()

    async def next_event(self) -> m.ShepherdEvent | None:
        """The shepherd's next event; None once it is gone (after ``empty``, or if it died)."""
        event = await self._events.get()
        if event is None:
            self._events.put_nowait(None)  # every later call sees the end too
        return event

    def signal(self, number: int) -> None:
        self._send(m.order("signal", number))

    def kill_tree(self) -> None:
        self._send(m.order("kill_tree"))

    def _send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(data)

    def close(self) -> None:
        """Closing makes the shepherd kill whatever is left of the tree."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


@dataclass(frozen=True, slots=True)
class Spawned:
    """A running program: its pid and its shepherd's channel (which now owns the events)."""

    pid: int
    control: Control
