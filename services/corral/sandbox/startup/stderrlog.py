"""Log lines on stderr for the sandbox's small long-lived processes (the init and the launcher), in the
controller's format (``<time> <LEVEL> <name>: <message>``), without the logging module.

Each of those processes lives as long as the sandbox does, and ``logging`` with what it imports is
about 1 MiB of each (bench/gateway.py's idle session). The API is the part of ``logging.Logger``
they use, so a call reads the same.
"""

from __future__ import annotations

import sys
import time


class StderrLog:
    def __init__(self, name: str) -> None:
        self.name = name

    def info(self, message: str, *args: object) -> None:
        self._say("INFO", message, args)

    def warning(self, message: str, *args: object) -> None:
        self._say("WARNING", message, args)

    def error(self, message: str, *args: object) -> None:
        self._say("ERROR", message, args)

    def exception(self, message: str, *args: object) -> None:
        """An error with the exception being handled, and its traceback (imported only then)."""
        import traceback

        self._say("ERROR", message, args, traceback.format_exc().rstrip("\n"))

    def _say(self, level: str, message: str, args: tuple[object, ...], detail: str = "") -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        text = message % args if args else message
        line = f"{stamp} {level} {self.name}: {text}\n" + (f"{detail}\n" if detail else "")
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):  # no stderr left (closed, or its reader gone): the line is lost
            pass
