"""The sandbox's init: Xvfb, then openbox, then Chromium, then the controller; restarts what dies.

It runs as ``corral`` holding only CAP_SETUID/SETGID/SETPCAP (see :mod:`corral.sandbox.startup.boot`) and
starts every child with no capability at all: Xvfb and the controller as ``corral``, openbox and
Chromium as ``browser``, a uid of their own (the agent's processes can neither trace nor signal them
nor read their memory), in the agent's group: Chromium saves downloads into the agent's Downloads
folder (made here as the agent, setgid and group-writable, with Chromium's umask leaving its files
readable and removable by the agent) and reads a file a page uploads from the agent's home. openbox
runs with a configuration that starts no program (images/desktop/openbox_rc.py): whoever drives the
screen cannot start one as the browser's uid. Its one start-up command is this init's, fixed
(:data:`OPENBOX_STARTUP`): a line on its stderr once it has announced itself.

Runs under tini (PID 1 reaps orphans). Readiness is signalled, not slept on:
Xvfb writes its display number to ``-displayfd`` once it accepts clients, openbox's start-up
command prints its line once openbox is the window manager, and Chromium prints its DevTools URL
once CDP listens.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from corral.errors import XDoorError
from corral.sandbox.display import xaccess
from corral.sandbox.startup.stderrlog import StderrLog

# No logging module (corral.sandbox.startup.stderrlog) and no dataclasses here: the init lives as long as the
# sandbox does, and those imports with what they pull in are about 2 MiB of every idle sandbox.
log = StderrLog("corral.init")

CDP_PORT = 9222
AGENT_USER = "agent"
AGENT_HOME = "/home/agent"
BROWSER_USER = "browser"
BROWSER_HOME = "/tmp/corral-browser"  # boot makes it, 0700, the browser's (corral.sandbox.startup.boot.BROWSER_HOME)
DOWNLOADS = f"{AGENT_HOME}/Downloads"  # the managed policy's DownloadDirectory (corral.sandbox.startup.boot)
OPENBOX_RC = "/usr/share/corral/openbox/rc.xml"  # made at image build: no binding starts a program
# Chromium's files: its downloads 0660 (the agent's group by the folder's setgid bit), nothing for others.
BROWSER_UMASK = 0o007
_CAP_SETUID, _CAP_SETGID, _CAP_SETPCAP = 7, 6, 8
# By its path, never by PATH: a template may put programs earlier on PATH (/usr/local/sbin), and
# these run with capabilities (corral.gateway.templates.check keeps this file the base's).
SETPRIV = "/usr/bin/setpriv"
# What runs as corral and as browser, by the base's paths, never by PATH, where a template's
# /usr/local/bin comes first (corral.gateway.templates.check keeps these files the base's).
XVFB = "/usr/bin/Xvfb"
OPENBOX = "/usr/bin/openbox"
CHROMIUM = "/usr/bin/chromium"
CERTUTIL = "/usr/bin/certutil"
# openbox runs this once it has announced itself (_NET_SUPPORTING_WM_CHECK and its name set on the root
# window), and its line on openbox's stderr tells the init so (the shell by the base's path, as above).
OPENBOX_READY = b"corral: openbox ready"
OPENBOX_STARTUP = shlex.join(["/usr/bin/sh", "-c", f"echo {OPENBOX_READY.decode()} >&2"])
# Chromium starts once openbox has announced itself, or after this long without it (a window manager
# that never comes up must not keep the browser down; its windows then get openbox's title bar later).
OPENBOX_READY_WAIT_S = 10.0
_READY_POLL_S = 0.1  # how often that wait looks whether the sandbox is stopping
_NO_CAPS = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
SESSION_CA = "/run/corral/session-ca.pem"  # written by corral.sandbox.startup.boot when the session has a proxy
_BACKOFF_MAX_S = 5.0
# Held exclusively while the browser's state is exported or imported (corral.sandbox.web.stateswap),
# with Chromium stopped: a restart waits for it (boot makes it, the browser's, readable by this uid's group).
BROWSER_LOCK = "/run/corral/browser.lock"
BROWSER_LOCK_WAIT_S = 120.0


def wait_unlocked(lock_file: str, wait_s: float) -> None:
    """Until nobody holds ``lock_file`` exclusively (bounded: a holder that never lets go does not keep
    Chromium down for good); nothing to wait for when it is not there (no uid split)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("%s held for %.0fs; starting Chromium anyway", lock_file, wait_s)
                    return
                time.sleep(0.05)
    finally:
        os.close(fd)


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


def effective_caps(status: str) -> int:
    """The CapEff mask from the text of /proc/<pid>/status."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def can_switch_users(caps: int) -> bool:
    return all(caps & (1 << cap) for cap in (_CAP_SETUID, _CAP_SETGID, _CAP_SETPCAP))


def as_controller(argv: list[str]) -> list[str]:
    """Run as the supervisor's own uid with every capability set emptied."""
    return [SETPRIV, *_NO_CAPS, "--", *argv]


def as_launcher(argv: list[str]) -> list[str]:
    """The launcher (corral.sandbox.agent.launcher) keeps CAP_SETUID and CAP_SETGID, and nothing else in
    any set: enough to act as the agent, not to gain anything back (no SETPCAP)."""
    keep = "-all,+setuid,+setgid"
    return [SETPRIV, f"--inh-caps={keep}", f"--ambient-caps={keep}", f"--bounding-set={keep}", "--", *argv]


def as_agent(argv: list[str]) -> list[str]:
    """Run as ``agent``: another uid, no supplementary groups, no capabilities, no privilege gain."""
    return [
        SETPRIV,
        f"--reuid={AGENT_USER}",
        f"--regid={AGENT_USER}",
        "--clear-groups",
        *_NO_CAPS,
        "--no-new-privs",
        "--",
        *argv,
    ]


def as_browser(argv: list[str]) -> list[str]:
    """Run as ``browser``: its own uid and group, plus the agent's group (the image's /etc/group: for
    downloads and uploads), no capabilities, no privilege gain."""
    return [
        SETPRIV,
        f"--reuid={BROWSER_USER}",
        f"--regid={BROWSER_USER}",
        "--init-groups",
        *_NO_CAPS,
        "--no-new-privs",
        "--",
        "env",
        f"--chdir={BROWSER_HOME}",
        "--",
        *argv,
    ]


def xvfb_auth_flags(cookie_file: str) -> list[str]:
    """Xvfb takes only clients with a cookie or a uid let in (corral.sandbox.display.xaccess), and never
    resets: a reset, once its last client left, would forget the browser's uid and the agent's cookie."""
    return ["-auth", cookie_file, "-noreset"]


def open_x_door(display: str, cookie_file: str) -> None:
    """As a trusted client, once Xvfb is up: the browser's uid let in, the agent's untrusted cookie
    written where the agent's programs find it (their XAUTHORITY)."""
    number = int(display.lstrip(":").split(".")[0])
    with open(cookie_file, "rb") as trusted:
        cookie = xaccess.cookie_of(trusted.read())
    untrusted = xaccess.open_door(f"/tmp/.X11-unix/X{number}", cookie, BROWSER_USER)
    xaccess.write_public(xaccess.AGENT_XAUTH, xaccess.xauthority(socket.gethostname(), number, untrusted))


def downloads_folder(wrap: Callable[[list[str]], list[str]], env: dict[str, str]) -> None:
    """The agent's Downloads folder, made as the agent: setgid and group-writable, so what Chromium
    (in the agent's group) saves there is the agent's group's, to read and remove."""
    subprocess.run(wrap(["install", "-d", "-m", "2770", DOWNLOADS]), check=True, capture_output=True, env=env)


def prepare_browser(
    cert: str | None,
    agent: Callable[[list[str]], list[str]],
    agent_env: dict[str, str],
    browser: Callable[[list[str]], list[str]],
    browser_env: dict[str, str],
) -> None:
    """What Chromium needs before it starts: the Downloads folder, and the session CA trusted."""
    downloads_folder(agent, agent_env)
    if cert is not None:
        trust_session_ca(browser_env["HOME"], cert, browser, browser_env)


def trust_session_ca(home: str, cert: str, wrap: Callable[[list[str]], list[str]], env: dict[str, str]) -> None:
    """Put the session's CA certificate into the browser user's NSS store, where Chromium looks."""
    nssdb = os.path.join(home, ".pki", "nssdb")
    database = f"sql:{nssdb}"

    def run(argv: list[str]) -> None:
        subprocess.run(wrap(argv), check=True, capture_output=True, env=env)

    run(["/usr/bin/mkdir", "-p", "-m", "0700", nssdb])
    if not os.path.exists(os.path.join(nssdb, "cert9.db")):
        run([CERTUTIL, "-N", "-d", database, "--empty-password"])
    run([CERTUTIL, "-A", "-d", database, "-n", "Corral session CA", "-t", "C,,", "-i", cert])


# DnsOverHttps: names resolve at the proxy. The rest is memory for one tab's use, measured by
# bench/gateway.py's idle session (PSS, MiB saved on Chromium 156): the WebUI omnibox popups, a
# renderer of their own held from start-up (about 50; the address bar's suggestions show in the
# native popup instead) and the other top-chrome WebUI preloaded beside them; the spare renderer
# kept ready for the next site (about 20; that site's first navigation starts its own process).
DISABLED_FEATURES = (
    "Translate",
    "MediaRouter",
    "OptimizationHints",
    "DialMediaRouteProvider",
    "DnsOverHttps",
    "PreloadTopChromeWebUI",
    "WebUIOmniboxPopup",
    "WebUIOmniboxAimPopup",
    "WebUIOmniboxFullPopup",
    "SpareRendererForSitePerProcess",
)
# The network service in the browser process, not a utility process of its own (about 20 MiB): a
# crash in it takes the browser down with it, which the init restarts.
ENABLED_FEATURES = ("NetworkServiceInProcess", "NetworkServiceInProcess2")
# GPU work (software compositing, as --disable-gpu leaves it) on a thread of the browser process,
# and no zygotes (the container is the sandbox: --no-sandbox already): about 35 MiB of processes.
# Tried for an idle session and left out, measured by each process's private memory (USS), which other
# sandboxes sharing the image's pages do not move as they move PSS: --no-zygote (3 MiB PSS less, each
# new renderer exec'd instead of forked), --enable-low-end-device-mode (no change), --disable-extensions,
# --disable-crash-reporter and --js-flags=--max-semi-space-size=1 (10 MiB more together).
ONE_TAB_FLAGS = ("--in-process-gpu",)
# Chromium's own traffic, off (boot.QUIET_POLICY says the same as managed policy): what the policy
# does not reach (the background fetches at start, domain reliability reports, field trials' config,
# hyperlink auditing pings). Each is a switch this Chromium knows (its binary names it; Chromium 156
# has no --disable-client-side-phishing-detection any more: safe browsing is off by policy instead).
# Two services no switch or policy turns off (Chromium 156, read in its NetLog and verbose log): the
# account list the sign-in code asks accounts.google.com for at start and on every google.com cookie
# change (with sign-in disabled by policy and by the profile's prefs, and retried with back-off), and
# the component updater's on-demand installs (the on-device model manifest, despite
# --disable-component-update and ComponentUpdatesEnabled). Both are pointed at port 1, which Chromium
# never connects to (an unsafe port: the request fails at once with ERR_UNSAFE_PORT, no socket, no
# proxy, nothing another process could answer); Google's sites still load as any other site.
INERT_URL = "http://127.0.0.1:1/"
QUIET_FLAGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-domain-reliability",
    "--disable-field-trial-config",
    "--disable-breakpad",
    "--no-pings",
    "--metrics-recording-only",
    f"--gaia-url={INERT_URL}",
    f"--component-updater=url-source={INERT_URL}",
)


# The Playwright driver (node, started by the controller, which passes its environment on): V8's young
# generation held small, 17 MiB less PSS idle (NODE_OPTIONS allows few V8 flags: --optimize-for-size
# makes node exit). The agent's commands get an environment of their own, without it.
DRIVER_NODE_OPTIONS = "--max-semi-space-size=1"
# The controller's environment (the driver inherits it): glibc's malloc arenas held to two, not eight
# per core, for its handful of threads (screen capture, encoders, asyncio's executor); with the heap
# trimmed once idle (corral.sandbox.trim) the controller holds about 7 MiB less (USS, 65.5 -> 58.4).
# Not one: the PNG encoder's two deflating threads then share one arena's lock, and a 1280x800 PNG
# took 20.8 ms against 9.7 with two, a JPEG 12.3 against 5.8 (bench/run.py, a run each).
CONTROLLER_ENV = {"NODE_OPTIONS": DRIVER_NODE_OPTIONS, "MALLOC_ARENA_MAX": "2"}


def _switch(flag: str) -> str:
    return flag.partition("=")[0]


QUIET_SWITCHES = frozenset(_switch(flag) for flag in QUIET_FLAGS)


def openbox_argv(config: str | None) -> list[str]:
    """openbox's command line: with the locked-down configuration (no binding starts a program) where
    given, and the start-up line that says it has announced itself (the init's, run once per start)."""
    return [OPENBOX, "--sm-disable", *(["--config-file", config] if config else []), "--startup", OPENBOX_STARTUP]


def chromium_argv(width: int, height: int, profile: str, extra: list[str]) -> list[str]:
    """Chromium's command line; ``extra`` (the operator's CORRAL_CHROMIUM_FLAGS, the proxy's) goes last,
    but never one of QUIET_FLAGS' switches: Chromium takes a switch's last value, and those stay Corral's."""
    extra = [flag for flag in extra if _switch(flag) not in QUIET_SWITCHES]
    return [
        CHROMIUM,
        f"--remote-debugging-port={CDP_PORT}",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}",
        # The container is the sandbox; Chromium's own needs user namespaces a hardened container lacks.
        "--no-sandbox",
        "--test-type",  # hides the --no-sandbox warning bar, which would shift the page
        "--no-first-run",
        "--no-default-browser-check",
        *QUIET_FLAGS,
        "--disable-default-apps",
        "--disable-quic",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        # No crash handler: its two processes (about 2 MiB) keep dumps nobody collects (no upload, and
        # the profile goes with the session); the init restarts a crashed Chromium all the same.
        "--disable-crashpad-for-testing",
        "--password-store=basic",
        # After a crash and restart, no "restore pages?" bubble over the page.
        "--hide-crash-restore-bubble",
        "--disable-session-crashed-bubble",
        # One --disable-features and one --enable-features only: Chromium honours the last of each.
        f"--disable-features={','.join(DISABLED_FEATURES)}",
        f"--enable-features={','.join(ENABLED_FEATURES)}",
        *ONE_TAB_FLAGS,
        "--force-device-scale-factor=1",
        "--window-position=0,0",
        f"--window-size={width},{height}",
        "--start-maximized",
        *extra,
        # No window at start, and Chromium kept running without one (with the debugging port it holds
        # itself alive until Browser.close): no page can quit it by closing the last tab. The
        # controller opens the first page and a blank one whenever the last closes (docs/design/0384).
        "--no-startup-window",
    ]


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        ready_marker: bytes | None = None,
        env: dict[str, str] | None = None,
        umask: int = -1,
        lock: str | None = None,
    ) -> None:
        self.name = name
        self.lock = lock  # waited for (shared) before each start
        self.argv = argv
        self.ready_marker = ready_marker
        self.env = env  # the supervisor's own when None
        self.umask = umask  # the supervisor's own when -1
        self.restarts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready = threading.Event()


class Supervisor:
    def __init__(self, width: int, height: int, depth: int, display: str) -> None:
        self.display = display
        self.env = {**os.environ, "DISPLAY": display}
        self.width, self.height, self.depth = width, height, depth
        self.stopping = False
        self.children: list[Child] = []

    def start_xvfb(self, wrap: Callable[[list[str]], list[str]], auth: list[str]) -> None:
        # Boot (root) made the socket directory; Xvfb as non-root will not make it itself.
        if not os.path.isdir("/tmp/.X11-unix"):
            os.makedirs("/tmp/.X11-unix", exist_ok=True)
            os.chmod("/tmp/.X11-unix", 0o1777)
        read_fd, write_fd = os.pipe()
        argv = [
            XVFB,
            self.display,
            "-screen",
            "0",
            f"{self.width}x{self.height}x{self.depth}",
            "-nolisten",
            "tcp",
            "-dpi",
            "96",
            # Chromium draws without GL (--disable-gpu): no Mesa in Xvfb (about 10 MiB).
            "-extension",
            "GLX",
            "-displayfd",
            str(write_fd),
            *auth,
        ]
        child = Child("xvfb", wrap(argv))
        child.proc = subprocess.Popen(child.argv, pass_fds=(write_fd,), env=self.env)
        child.started_at = time.monotonic()
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as ready:
            if not ready.readline():
                raise RuntimeError("Xvfb exited before it was ready")
        self.children.append(child)
        log.info("Xvfb ready on %s (%dx%d)", self.display, self.width, self.height)

    def spawn(self, child: Child) -> None:
        child.ready.clear()
        if child.lock is not None:
            wait_unlocked(child.lock, BROWSER_LOCK_WAIT_S)
        stderr = subprocess.PIPE if child.ready_marker else None
        env = self.env if child.env is None else child.env
        child.proc = subprocess.Popen(child.argv, env=env, stderr=stderr, stdin=subprocess.DEVNULL, umask=child.umask)
        child.started_at = time.monotonic()
        if child.ready_marker and child.proc.stderr is not None:
            threading.Thread(target=self._pump, args=(child, child.proc.stderr), daemon=True).start()
        if child not in self.children:
            self.children.append(child)

    def _pump(self, child: Child, stream: object) -> None:
        # Forward the child's stderr and notice its readiness line. The pipe is read to its end
        # whatever happens to our own stderr: a child blocked on a full pipe would hang (openbox
        # holds every click until it has replayed it).
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            if child.ready_marker and child.ready_marker in line:
                child.ready.set()
                log.info("%s ready: %s", child.name, line.decode(errors="replace").strip())
            with contextlib.suppress(OSError, ValueError):
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
    try:
        width, height, depth = screen_spec(os.environ.get("CORRAL_SCREEN", "1280x800"))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    display = os.environ.get("DISPLAY", ":0")

    extra = egress_flags(os.environ.get("CORRAL_PROXY")) + shlex.split(os.environ.get("CORRAL_CHROMIUM_FLAGS", ""))
    with open("/proc/self/status", encoding="ascii") as status:
        split = can_switch_users(effective_caps(status.read()))
    own, agent, browser = (as_controller, as_agent, as_browser) if split else (list, list, list)
    if not split:
        if os.environ.get("CORRAL_INNER_BOUNDARY", "") == "required":
            log.error("started without CAP_SETUID/SETGID/SETPCAP: cannot run Chromium as another uid; refusing")
            return 3
        log.warning("started without CAP_SETUID: Chromium runs as the controller's uid (no inner boundary)")
    # The browser's profile in its own home; without the uid split, where the controller's uid may write.
    profile = os.environ.get("CORRAL_CHROMIUM_PROFILE", f"{BROWSER_HOME}/profile" if split else "/tmp/chromium-profile")
    sup = Supervisor(width, height, depth, display)
    agent_env = {**sup.env, "HOME": AGENT_HOME, "USER": AGENT_USER, "LOGNAME": AGENT_USER} if split else sup.env
    browser_env = {**sup.env, "HOME": BROWSER_HOME, "USER": BROWSER_USER, "LOGNAME": BROWSER_USER} if split else sup.env
    trusting: threading.Thread | None = None
    if split or os.path.exists(SESSION_CA):
        # certutil takes a few tens of ms: alongside Xvfb, joined before Chromium starts.
        cert = SESSION_CA if os.path.exists(SESSION_CA) else None
        if split:
            args = (cert, agent, agent_env, browser, browser_env)
            trusting = threading.Thread(target=prepare_browser, args=args, daemon=True)
        else:
            home = os.environ.get("HOME", "/home/corral")
            trusting = threading.Thread(target=trust_session_ca, args=(home, SESSION_CA, list, sup.env), daemon=True)
        trusting.start()
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    if split:
        # Commands and file operations as the agent, for the controller, which holds no capability.
        sup.spawn(Child("launcher", as_launcher([sys.executable, "-P", "-m", "corral.sandbox.agent.launcher"])))
    guarded_x = split and os.path.exists(xaccess.CONTROLLER_XAUTH)
    if split and not guarded_x:
        if os.environ.get("CORRAL_INNER_BOUNDARY", "") == "required":
            log.error("no X cookie from boot: the agent's programs would be trusted X clients; refusing")
            return 3
        log.warning("no X cookie from boot: every local client is a trusted X client")
    x_auth = {"XAUTHORITY": str(xaccess.CONTROLLER_XAUTH)} if guarded_x else {}
    # The controller imports for most of a second: start it first, it waits for the display itself.
    controller_env = {**sup.env, **CONTROLLER_ENV, **x_auth}
    sup.spawn(Child("controller", own([sys.executable, "-P", "-m", "corral.sandbox.controller"]), env=controller_env))
    sup.start_xvfb(own, xvfb_auth_flags(str(xaccess.CONTROLLER_XAUTH)) if guarded_x else [])
    if guarded_x:
        try:
            open_x_door(display, str(xaccess.CONTROLLER_XAUTH))
        except (OSError, ValueError, XDoorError) as exc:
            log.error("cannot set who may use the X server (%s); stopping the sandbox", exc)
            sup.stop()
            return 3
    openbox_args = browser(openbox_argv(OPENBOX_RC if split else None))
    openbox = Child("openbox", openbox_args, ready_marker=OPENBOX_READY, env=browser_env)
    sup.spawn(openbox)
    if trusting is not None:
        trusting.join()
    chromium = browser(chromium_argv(width, height, profile, extra))
    umask = BROWSER_UMASK if split else -1
    lock = BROWSER_LOCK if split else None
    ready = b"DevTools listening on"
    start_after(sup, openbox, Child("chromium", chromium, ready_marker=ready, env=browser_env, umask=umask, lock=lock))
    return sup.watch()


def start_after(sup: Supervisor, window_manager: Child, browser: Child, wait_s: float = OPENBOX_READY_WAIT_S) -> None:
    """Start the browser once the window manager has announced itself (bounded: one that never does
    must not keep the browser down).

    Chromium picks its window frame once, at start, from the window manager it finds: its own (tabs in
    the title bar) when openbox has announced itself, openbox's title bar above the tabs when none has.
    Started before openbox was up, as a loaded host made it, every screen of the session was 22 pixels
    lower than another session's, and a recording made in one failed every step of its replay in the
    other (docs/design/0477). Only the first start waits: a restarted Chromium finds openbox's
    announcement on the root window (it stays there while openbox runs, even stopped)."""
    # Polled in short waits rather than one: a stop meanwhile (SIGTERM) ends the wait, and nothing
    # more is started. Never by Popen.poll, which would reap an exited window manager that the
    # supervisor's os.wait must see to restart it.
    deadline = time.monotonic() + wait_s
    while not window_manager.ready.is_set() and not sup.stopping:
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning(
                "%s did not announce itself within %.0f s: %s starts all the same",
                window_manager.name,
                wait_s,
                browser.name,
            )
            break
        window_manager.ready.wait(min(_READY_POLL_S, left))
    if not sup.stopping:
        sup.spawn(browser)


if __name__ == "__main__":
    sys.exit(main())
