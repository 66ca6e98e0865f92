"""The sandbox's init: Xvfb, then openbox, then Chromium, then the controller; restarts what dies.

Runs under tini (PID 1 reaps orphans). Readiness is signalled, not slept on:
Xvfb writes its display number to ``-displayfd`` once it accepts clients and
Chromium prints its DevTools URL once CDP listens.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("corral.init")

CDP_PORT = 9222
SESSION_CA = "/run/corral/session-ca.pem"  # written by corral.sandbox.boot when the session has a proxy
_BACKOFF_MAX_S = 5.0


def screen_spec(value: str) -> tuple[int, int, int]:
    """``1280x800`` or ``1280x800x24`` to (width, height, depth); raises ValueError."""
    parts = value.lower().split("x")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"screen must look like 1280x800 or 1280x800x24, not {value!r}")
    width, height = int(parts[0]), int(parts[1])
    depth = int(parts[2]) if len(parts) == 3 else 24
    if not (16 <= width <= 8192 and 16 <= height <= 8192) or depth != 24:
        raise ValueError(f"unsupported screen {value!r}: 16..8192 pixels a side, depth 24")
    return width, height, depth


def egress_flags(proxy: str | None) -> list[str]:
    """Chromium's side of egress control (the managed policy written at boot says the same)."""
    if not proxy:
        return []
    return [
        f"--proxy-server=http://{proxy}",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]


def trust_session_ca(home: str, cert: str) -> None:
    """Put the session's CA certificate into the user's NSS store, where Chromium looks."""
    nssdb = os.path.join(home, ".pki", "nssdb")
    os.makedirs(nssdb, mode=0o700, exist_ok=True)
    database = f"sql:{nssdb}"
    if not os.path.exists(os.path.join(nssdb, "cert9.db")):
        subprocess.run(["certutil", "-N", "-d", database, "--empty-password"], check=True, capture_output=True)
    subprocess.run(
        ["certutil", "-A", "-d", database, "-n", "Corral session CA", "-t", "C,,", "-i", cert],
        check=True,
        capture_output=True,
    )


def chromium_argv(width: int, height: int, profile: str, extra: list[str]) -> list[str]:
    return [
        "chromium",
        f"--remote-debugging-port={CDP_PORT}",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}",
        # The container is the sandbox; Chromium's own needs user namespaces a hardened container lacks.
        "--no-sandbox",
        "--test-type",  # hides the --no-sandbox warning bar, which would shift the page
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-quic",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--password-store=basic",
        # After a crash and restart, no "restore pages?" bubble over the page.
        "--hide-crash-restore-bubble",
        "--disable-session-crashed-bubble",
        # One --disable-features only: Chromium honours the last. DnsOverHttps: names resolve at the proxy.
        "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider,DnsOverHttps",
        "--force-device-scale-factor=1",
        "--window-position=0,0",
        f"--window-size={width},{height}",
        "--start-maximized",
        *extra,
        "about:blank",
    ]


@dataclass
class Child:
    name: str
    argv: list[str]
    ready_marker: bytes | None = None
    restarts: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)


class Supervisor:
    def __init__(self, width: int, height: int, depth: int, display: str) -> None:
        self.display = display
        self.env = {**os.environ, "DISPLAY": display}
        self.width, self.height, self.depth = width, height, depth
        self.stopping = False
        self.children: list[Child] = []

    def start_xvfb(self) -> None:
        # /tmp is a fresh tmpfs in a hardened container; Xvfb as non-root will not make its socket dir.
        os.makedirs("/tmp/.X11-unix", exist_ok=True)
        os.chmod("/tmp/.X11-unix", 0o1777)
        read_fd, write_fd = os.pipe()
        argv = [
            "Xvfb",
            self.display,
            "-screen",
            "0",
            f"{self.width}x{self.height}x{self.depth}",
            "-nolisten",
            "tcp",
            "-dpi",
            "96",
            "-displayfd",
            str(write_fd),
        ]
        child = Child("xvfb", argv)
        child.proc = subprocess.Popen(argv, pass_fds=(write_fd,), env=self.env)
        child.started_at = time.monotonic()
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as ready:
            if not ready.readline():
                raise RuntimeError("Xvfb exited before it was ready")
        self.children.append(child)
        log.info("Xvfb ready on %s (%dx%d)", self.display, self.width, self.height)

    def spawn(self, child: Child) -> None:
        child.ready.clear()
        stderr = subprocess.PIPE if child.ready_marker else None
        child.proc = subprocess.Popen(child.argv, env=self.env, stderr=stderr, stdin=subprocess.DEVNULL)
        child.started_at = time.monotonic()
        if child.ready_marker and child.proc.stderr is not None:
            threading.Thread(target=self._pump, args=(child, child.proc.stderr), daemon=True).start()
        if child not in self.children:
            self.children.append(child)

    def _pump(self, child: Child, stream: object) -> None:
        # Forward the child's stderr and notice its readiness line.
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            if child.ready_marker and child.ready_marker in line:
                child.ready.set()
                log.info("%s ready: %s", child.name, line.decode(errors="replace").strip())
            sys.stderr.buffer.write(line)
            sys.stderr.flush()

    def stop(self, *_args: object) -> None:
        self.stopping = True
        for child in reversed(self.children):
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()

    def watch(self) -> int:
        """Wait for children to exit; restart all but Xvfb, whose death ends the sandbox."""
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                return 0
            child = next((c for c in self.children if c.proc is not None and c.proc.pid == pid), None)
            if child is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if child.proc is not None:
                child.proc.returncode = code
            if self.stopping:
                if all(c.proc is None or c.proc.returncode is not None for c in self.children):
                    return 0
                continue
            if child.name == "xvfb":
                log.error("Xvfb exited (%s); stopping the sandbox", code)
                self.stop()
                return 1
            lived = time.monotonic() - child.started_at
            child.restarts = 0 if lived > 30 else child.restarts + 1
            delay = min(_BACKOFF_MAX_S, 0.1 * (2**child.restarts)) if child.restarts else 0.0
            log.warning("%s exited (%s) after %.1fs; restarting in %.1fs", child.name, code, lived, delay)
            if delay:
                time.sleep(delay)
            self.spawn(child)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        width, height, depth = screen_spec(os.environ.get("CORRAL_SCREEN", "1280x800"))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    display = os.environ.get("DISPLAY", ":0")
    profile = os.environ.get("CORRAL_CHROMIUM_PROFILE", "/tmp/chromium-profile")
    extra = egress_flags(os.environ.get("CORRAL_PROXY")) + shlex.split(os.environ.get("CORRAL_CHROMIUM_FLAGS", ""))
    trusting: threading.Thread | None = None
    if os.path.exists(SESSION_CA):
        # certutil takes a few tens of ms: alongside Xvfb, joined before Chromium starts.
        trusting = threading.Thread(
            target=trust_session_ca, args=(os.environ.get("HOME", "/home/corral"), SESSION_CA), daemon=True
        )
        trusting.start()
    sup = Supervisor(width, height, depth, display)
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    # The controller imports for most of a second: start it first, it waits for the display itself.
    sup.spawn(Child("controller", [sys.executable, "-m", "corral.sandbox.controller"]))
    sup.start_xvfb()
    sup.spawn(Child("openbox", ["openbox", "--sm-disable"]))
    if trusting is not None:
        trusting.join()
    sup.spawn(Child("chromium", chromium_argv(width, height, profile, extra), ready_marker=b"DevTools listening on"))
    return sup.watch()


if __name__ == "__main__":
    sys.exit(main())
