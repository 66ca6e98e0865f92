"""The sandbox's first process, as root: lock egress down, then become ``corral`` with no
capabilities at all and exec tini, which runs :mod:`corral.sandbox.startup.init`.

With a proxy (``CORRAL_PROXY``), the firewall allows out only loopback and TCP to the proxy's
ports on the session network, and in only the gateway's connections to the controller; the bridge's
host address is refused outright (Docker lets an ``--internal`` network reach the host through it).
It is set before anything the agent can touch starts, and nothing in the sandbox can change it
afterwards: NET_ADMIN is gone from every process, bounding set included.

Root also writes what the sandbox must trust and may not change: Chromium's managed policy (the
proxy, QUIC off, WebRTC only through the proxy, DNS-over-HTTPS off, downloads into the agent's
Downloads folder without a prompt) and the system CA bundle with the session's CA certificate (the
key never comes here).

Three uids share the sandbox (who runs as which, docs/egress.md "The inner boundary"):

- ``corral`` runs the supervisor, Xvfb and the controller. Boot writes the controller's per-boot
  secret into ``/run/corral/controller``, 0700 for ``corral`` (the egress control channel's token
  comes as a read-only file of ``corral``'s, mounted by the runtime: never an environment variable,
  which every ``docker exec`` would inherit);
- ``agent`` runs whatever the agent runs. It cannot signal, trace or read the ``corral`` or
  ``browser`` processes;
- ``browser`` runs Chromium and openbox, in the agent's group (downloads, uploads), with a home of
  its own that boot makes (``BROWSER_HOME``, in ``/tmp``, before anything of the agent's runs).

An owner match in the firewall keeps ``agent`` and ``browser`` from the controller's and DevTools'
ports and the proxy's control port, and from answering on the controller's port.

The supervisor keeps CAP_SETUID, CAP_SETGID and CAP_SETPCAP (uid ``corral``, ambient) only to start
each child with nothing: ``agent`` and ``browser`` children through setpriv with every set empty,
``corral`` ones likewise. A capability-holding process cannot be traced by one of its own uid without them.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.contracts import auth
from corral.sandbox.display import xaccess

log = logging.getLogger("corral.boot")

USER = "corral"  # the supervisor, Xvfb, the controller
AGENT_USER = "agent"  # everything the agent runs
BROWSER_USER = "browser"  # Chromium and openbox
BROWSER_HOME = Path("/tmp/corral-browser")  # its HOME and profile: boot makes it, 0700, before the agent runs
SUPERVISOR_CAPS = ("setuid", "setgid", "setpcap")
X11_DIR = Path("/tmp/.X11-unix")
SECRET_DIR = auth.SECRET_DIR
RUN_DIR = Path("/run/corral")
CHROMIUM_POLICY = RUN_DIR / "chromium-policy.json"
BROWSER_LOCK = RUN_DIR / "browser.lock"  # corral.sandbox.web.stateswap holds it; the init waits on it
CA_CERT = RUN_DIR / "session-ca.pem"
XAUTH_DIR = Path(xaccess.XAUTH_DIR)  # the X server's cookies (corral.sandbox.display.xaccess)
LAUNCHER_DIR = RUN_DIR / "launcher"  # the launcher's socket: corral's alone (corral.sandbox.agent.launcher)
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PRISTINE_BUNDLE = Path("/usr/share/corral/ca-certificates.crt")  # Debian's, copied at image build
CONTROLLER_PORT = 8765
DEVTOOLS_PORT = 9222
# What a template put under the agent's tmpfs mounts (its home, /workspace), moved aside at its build
# (corral.gateway.templates.dockerfile): copied in at each boot, as the agent, modes kept.
SEED_DIR = Path("/usr/share/corral/seed")
# Where boot finds what it runs as root with NET_ADMIN: the base's own directories, never the image's
# PATH, on which a template's /usr/local/sbin comes first (corral.gateway.templates.check keeps these
# programs the base's).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SETPRIV = "/usr/bin/setpriv"  # by its path too (as corral.sandbox.startup.init's)
SEEDED = ("/home/agent", "/workspace")
SEED_TIMEOUT_S = 60
DOWNLOADS = "/home/agent/Downloads"  # where the browser saves, and where file_list finds it
# "1": the runtime gave the controller's secret as a file already at auth.SECRET_FILE (the swarm
# driver's Swarm secret, the controller's uid's, 0400): no ``docker exec`` on another node reads a
# secret boot makes, so boot makes none and checks the one it is given.
SECRET_GIVEN = "CORRAL_SECRET_GIVEN"
# tmpfs mounts -> (user) owner: a Swarm service's tmpfs takes a mode but no uid, so boot hands each
# to its user itself (a no-op where the runtime mounted them owned already, as the docker driver does).
TMPFS_OWNERS = {"/home/corral": USER, "/home/agent": AGENT_USER, "/workspace": AGENT_USER}
PR_SET_NO_NEW_PRIVS = 38


def proxy_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"CORRAL_PROXY must look like host:port, not {value!r}")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Fenced:
    """The uids the firewall keeps off the sandbox's own ports: the agent's and the browser's."""

    agent: int
    browser: int


def agent_rules(fenced: Fenced, control_port: int | None) -> list[str]:
    """OUTPUT rules, first in the chain: neither the agent's uid nor the browser's reaches the
    controller, DevTools or the proxy's control channel, and neither can answer on the controller's
    port (so a process bound there after a crash never completes a handshake with the gateway).
    Chromium answers on DevTools' port as the browser: its answers are not new connections; the
    agent's uid cannot answer there."""
    guarded = [CONTROLLER_PORT, DEVTOOLS_PORT] + ([control_port] if control_port else [])
    dports = ",".join(str(port) for port in guarded)
    rules = []
    for uid in (fenced.agent, fenced.browser):
        owner = f"-m owner --uid-owner {uid}"
        rules += [
            f"-A OUTPUT -p tcp -m multiport --dports {dports} {owner} -j REJECT --reject-with tcp-reset",
            f"-A OUTPUT -p tcp --sport {CONTROLLER_PORT} {owner} -j DROP",
        ]
    # Nor can the agent answer on DevTools' port (a process of its own bound there while Chromium is
    # down): what the controller reads there is Chromium's word, never the agent's.
    return [*rules, f"-A OUTPUT -p tcp --sport {DEVTOOLS_PORT} -m owner --uid-owner {fenced.agent} -j DROP"]


def open_rules(fenced: Fenced) -> str:
    """Without a proxy (no egress control): everything open but what :func:`agent_rules` closes."""
    head = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]"]
    return "\n".join([*head, *agent_rules(fenced, None), "COMMIT", ""])


def firewall_rules(network: str, gateway: str, proxy_ports: list[int], fenced: Fenced) -> str:
    """An ``iptables-restore`` ruleset for the filter table (IPv4); ``proxy_ports[1]`` is the control port."""
    net = ipaddress.ip_network(network, strict=False)
    host = ipaddress.ip_address(gateway)
    if host not in net:
        raise ValueError(f"gateway {gateway} is not inside the session network {network}")
    ports = ",".join(str(port) for port in proxy_ports)
    return "\n".join(
        [
            "*filter",
            ":INPUT DROP [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT DROP [0:0]",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A INPUT -p tcp -s {host}/32 --dport {CONTROLLER_PORT} -j ACCEPT",
            *agent_rules(fenced, proxy_ports[1] if len(proxy_ports) > 1 else None),
            "-A OUTPUT -o lo -j ACCEPT",
            "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A OUTPUT -d {host}/32 -j REJECT --reject-with icmp-admin-prohibited",
            f"-A OUTPUT -p tcp -d {net} -m multiport --dports {ports} -j ACCEPT",
            # REJECT, not DROP: a bypass attempt fails at once instead of hanging the agent.
            "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
            "-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited",
            "COMMIT",
            "",
        ]
    )


def ipv6_rules(fenced: Fenced, proxied: bool) -> str:
    """IPv6: loopback only with a proxy (the proxy is reached over IPv4); the agent's rules always."""
    policy = "DROP" if proxied else "ACCEPT"
    lines = ["*filter", f":INPUT {policy} [0:0]", ":FORWARD DROP [0:0]", f":OUTPUT {policy} [0:0]"]
    lines += agent_rules(fenced, None)
    lines += ["-A INPUT -i lo -j ACCEPT", "-A OUTPUT -o lo -j ACCEPT", "COMMIT", ""]
    return "\n".join(lines)


# Chromium's own traffic, off: the session's audit log holds what the session did (issue 28: an idle
# session logged 13 requests of Chromium's own in 20 s, to accounts.google.com, update.googleapis.com
# and clients2.google.com). Managed policy, so a profile's preferences (a saved browser profile, a
# page's settings) cannot turn any of it back on; init.QUIET_FLAGS says the same where a switch exists.
QUIET_POLICY: dict[str, object] = {
    "BrowserSignin": 0,  # no Google account in the browser: no accounts.google.com fetches
    "SyncDisabled": True,
    "ComponentUpdatesEnabled": False,  # update.googleapis.com
    "ChromeVariations": 2,  # no field trials, so no variations seed fetched
    "BrowserNetworkTimeQueriesEnabled": False,  # clients2.google.com/time
    "SafeBrowsingProtectionLevel": 0,  # no list updates, no lookups of the pages visited
    "MetricsReportingEnabled": False,
    "UrlKeyedAnonymizedDataCollectionEnabled": False,
    "DomainReliabilityAllowed": False,
    "UserFeedbackAllowed": False,
    "FeedbackSurveysEnabled": False,
    "WebRtcEventLogCollectionAllowed": False,
    "SearchSuggestEnabled": False,  # typing in the address bar sends nothing
    "NetworkPredictionOptions": 2,  # no preconnects or prefetches the page did not ask for
    "AlternateErrorPagesEnabled": False,
    "SpellcheckEnabled": False,  # no dictionary downloads
    "SpellCheckServiceEnabled": False,
    "TranslateEnabled": False,
    "PromotionalTabsEnabled": False,
    "DefaultBrowserSettingEnabled": False,
    "ShoppingListEnabled": False,
    "PaymentMethodQueryEnabled": False,
    "EnableMediaRouter": False,
}


def chromium_policy(proxy: str | None) -> dict[str, object]:
    policy: dict[str, object] = {
        **QUIET_POLICY,
        "QuicAllowed": False,
        "DnsOverHttpsMode": "off",
        "BuiltInDnsClientEnabled": False,
        "WebRtcIPHandling": "disable_non_proxied_udp",
        "BackgroundModeEnabled": False,
        # Chromium makes the folder (as the agent) on the first download.
        "DownloadDirectory": DOWNLOADS,
        "PromptForDownloadLocation": False,
        # Nothing a person types is kept on disk by Chromium: the agent can reach the browser's files
        # through the browser itself (a file input reads what the browser's uid reads).
        "PasswordManagerEnabled": False,
        "AutofillAddressEnabled": False,
        "AutofillCreditCardEnabled": False,
    }
    if proxy:
        policy["ProxySettings"] = {"ProxyMode": "fixed_servers", "ProxyServer": f"http://{proxy}"}
    return policy


def _apply(command: str, rules: str) -> None:
    binary = shutil.which(command, path=SYSTEM_PATH)  # never the image's PATH: see SYSTEM_PATH
    if binary is None:
        raise RuntimeError(f"{command} is missing from the image")
    done = subprocess.run([binary], input=rules.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed: {done.stderr.decode(errors='replace').strip()}")


@dataclass(frozen=True, slots=True)
class Users:
    """The sandbox's three users, as the image defines them."""

    controller_uid: int
    controller_gid: int
    controller_home: str
    agent_uid: int
    browser_uid: int
    browser_gid: int

    @classmethod
    def of_image(cls) -> Users:
        controller, agent = pwd.getpwnam(USER), pwd.getpwnam(AGENT_USER)
        browser = pwd.getpwnam(BROWSER_USER)
        return cls(
            controller.pw_uid, controller.pw_gid, controller.pw_dir, agent.pw_uid, browser.pw_uid, browser.pw_gid
        )

    @property
    def fenced(self) -> Fenced:
        return Fenced(self.agent_uid, self.browser_uid)


def lock_down(env: Mapping[str, str], users: Users) -> None:
    """Firewall, secrets and trust, as root; raises (and the sandbox does not start) if any of it fails."""
    proxy = env.get("CORRAL_PROXY", "")
    RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    fenced = users.fenced
    if proxy:
        _, port = proxy_address(proxy)
        control_port = int(env.get("CORRAL_PROXY_CONTROL_PORT", "8081"))
        network, gateway = env.get("CORRAL_SESSION_NET", ""), env.get("CORRAL_SESSION_GATEWAY", "")
        if not network or not gateway:
            raise RuntimeError("CORRAL_PROXY needs CORRAL_SESSION_NET and CORRAL_SESSION_GATEWAY")
        _apply_both(firewall_rules(network, gateway, [port, control_port], fenced), ipv6_rules(fenced, proxied=True))
        log.info("egress locked to the proxy at %s (session network %s)", proxy, network)
    else:
        try:
            _apply_both(open_rules(fenced), ipv6_rules(fenced, proxied=False))
        except RuntimeError as exc:
            if boundary_required(env):
                raise RuntimeError(f"the agent's uid cannot be kept off the controller: {exc}") from None
            # Run by hand without NET_ADMIN (plain `docker run`): the per-boot secret still guards the
            # controller, but the agent's uid is not kept off its port. Corral's runtime always grants it.
            log.warning("no firewall for the agent's uid (%s); the controller's secret still guards it", exc)
    # Only once the firewall holds: a sandbox that cannot be locked down never has a usable secret.
    if env.get(SECRET_GIVEN) == "1":
        given_secret(users, SECRET_DIR)
    else:
        write_secret(users, SECRET_DIR)
    log.info(auth.SECRET_WRITTEN)
    write_xauthority(users, XAUTH_DIR, display_number(env.get("DISPLAY", ":0")), socket.gethostname())
    private_dir(LAUNCHER_DIR, users.controller_uid, users.controller_gid)
    private_dir(BROWSER_HOME, users.browser_uid, users.browser_gid)
    browser_lock(BROWSER_LOCK, users)
    _x11_dir()
    CHROMIUM_POLICY.write_text(json.dumps(chromium_policy(proxy or None)))
    ca = env.get("CORRAL_CA_CERT", "")
    if ca:
        if "BEGIN CERTIFICATE" not in ca or "PRIVATE KEY" in ca:
            raise RuntimeError("CORRAL_CA_CERT must hold one PEM certificate and nothing else")
        CA_CERT.write_text(ca.strip() + "\n")
        if PRISTINE_BUNDLE.exists() and SYSTEM_BUNDLE.parent.is_dir() and os.access(SYSTEM_BUNDLE.parent, os.W_OK):
            SYSTEM_BUNDLE.write_text(PRISTINE_BUNDLE.read_text() + "\n" + ca.strip() + "\n")
    elif PRISTINE_BUNDLE.exists() and os.access(SYSTEM_BUNDLE.parent, os.W_OK) and not SYSTEM_BUNDLE.exists():
        shutil.copyfile(PRISTINE_BUNDLE, SYSTEM_BUNDLE)


def seed_agent_dirs(users: Users, seed: Path = SEED_DIR) -> None:
    """A template's files into the agent's tmpfs mounts, copied by ``cp`` run as the agent (never as
    root: a link in the seed reaches only what the agent could read anyway), modes and times kept.
    Nothing to do, and no cost, for the base image, which has no seed. A copy that fails (a seed
    larger than the mount) is logged and the sandbox starts with what fitted."""
    for target in SEEDED:
        source = seed / target.lstrip("/")
        if not source.is_dir():
            continue
        # --no-clobber: a file already there (a workspace volume's) is the owner's, never the template's to replace.
        argv = ["cp", "-R", "--no-clobber", "--no-dereference", "--preserve=mode,timestamps,links"]
        argv += [f"{source}/.", f"{target}/"]
        try:
            done = subprocess.run(
                argv,
                user=users.agent_uid,
                group=users.agent_uid,  # the agent's own group has its uid's number (the image's useradd)
                extra_groups=[],
                capture_output=True,
                text=True,
                check=False,
                timeout=SEED_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            log.warning("seeding %s from the template took over %d s; left as it got", target, SEED_TIMEOUT_S)
            continue
        if done.returncode != 0:
            log.warning("seeding %s from the template failed: %s", target, done.stderr.strip()[-500:])


def boundary_required(env: Mapping[str, str]) -> bool:
    """Corral's runtime asks for the whole inner boundary (``CORRAL_INNER_BOUNDARY=required``): a
    sandbox it starts never runs without it. By hand, a missing half is a warning."""
    return env.get("CORRAL_INNER_BOUNDARY", "") == "required"


def _apply_both(ipv4: str, ipv6: str) -> None:
    """IPv4's rules and IPv6's at once: two processes on a sandbox whose cores nothing else uses yet,
    and boot is every cold start's first step. Raises (IPv4's failure first) once both have ended."""
    failures: list[BaseException] = []

    def six() -> None:
        try:
            _apply_ipv6(ipv6)
        except BaseException as exc:  # handed to the caller below, after IPv4's
            failures.append(exc)

    thread = threading.Thread(target=six, name="ip6tables")
    thread.start()
    try:
        _apply("iptables-restore", ipv4)
    finally:
        thread.join()
    if failures:
        raise failures[0]


def _apply_ipv6(rules: str) -> None:
    try:
        _apply("ip6tables-restore", rules)
    except RuntimeError as exc:
        # No IPv6 in this network namespace means no IPv6 route either.
        if Path("/proc/net/if_inet6").exists() and Path("/proc/net/if_inet6").read_text().strip():
            raise
        log.info("no IPv6 here (%s)", exc)


def write_secret(users: Users, directory: Path) -> None:
    """A fresh controller secret, readable by ``corral`` alone."""
    # Root holds no CAP_DAC_OVERRIDE or CAP_FOWNER here: it writes while it owns the directory (a
    # restarted container's may be corral's), then hands both over with CAP_CHOWN.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(directory, os.getuid(), os.getgid())
    directory.chmod(0o700)
    path = directory / auth.SECRET_FILE.name
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, auth.new_secret().encode() + b"\n")
        os.fchown(fd, users.controller_uid, users.controller_gid)
    finally:
        os.close(fd)
    os.chown(directory, users.controller_uid, users.controller_gid)


def given_secret(users: Users, directory: Path) -> None:
    """The secret the runtime mounted checked (a regular file of ``corral``'s that no other uid can
    read) and its directory made ``corral``'s alone, as :func:`write_secret` leaves it."""
    path = directory / auth.SECRET_FILE.name
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode) or info.st_uid != users.controller_uid or info.st_mode & 0o077:
        raise RuntimeError(f"the given controller secret {path} must be a file of uid {users.controller_uid}, 0400")
    os.chown(directory, os.getuid(), os.getgid())
    directory.chmod(0o700)
    os.chown(directory, users.controller_uid, users.controller_gid)


def own_tmpfs_mounts(owners: Mapping[str, str]) -> list[str]:
    """Each mount point in ``owners`` handed to its user (and group) when it is a mount still root's;
    returns what was handed over. Never follows a link: these are made before anything of the agent's runs."""
    handed = []
    for path, user in owners.items():
        if not os.path.ismount(path) or os.lstat(path).st_uid != 0:
            continue
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        handed.append(path)
    return handed


def no_new_privileges() -> None:
    """PR_SET_NO_NEW_PRIVS for boot and all it starts (inherited, never undone): what Docker's
    ``no-new-privileges`` gives a container, which a Swarm service cannot ask for on Docker 20.10."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def display_number(display: str) -> int:
    """``:0`` or ``:0.0`` to 0; raises ValueError for a display that is not a local one."""
    host, _, rest = display.partition(":")
    number = rest.split(".")[0]
    if host or not number.isdigit():
        raise ValueError(f"DISPLAY must be a local display such as :0, not {display!r}")
    return int(number)


def write_xauthority(users: Users, directory: Path, display: int, hostname: str) -> None:
    """A fresh trusted X cookie, readable by ``corral`` alone (Xvfb's ``-auth``, the controller's
    ``XAUTHORITY``), in a directory of ``corral``'s where the init writes the agent's untrusted one."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chown(directory, os.getuid(), os.getgid())
    directory.chmod(0o755)
    for stale in directory.iterdir():
        stale.unlink()
    path = directory / Path(xaccess.CONTROLLER_XAUTH).name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, xaccess.xauthority(hostname, display, secrets.token_bytes(16)))
        os.fchown(fd, users.controller_uid, users.controller_gid)
    finally:
        os.close(fd)
    os.chown(directory, users.controller_uid, users.controller_gid)


def browser_lock(path: Path, users: Users) -> None:
    """The lock the browser's state is swapped under: the browser's (its export and import take it
    exclusively), readable by the init's group (which waits on it, shared, before starting Chromium),
    nothing for the agent (who could otherwise hold Chromium down)."""
    # Made anew, mode first and then handed over (root holds no CAP_FOWNER to chmod another's file).
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o640)
        os.fchown(fd, users.browser_uid, users.controller_gid)
    finally:
        os.close(fd)


def private_dir(directory: Path, uid: int, gid: int) -> None:
    """A directory only ``uid`` may enter (the launcher's socket lives in one of ``corral``'s, the
    browser's home and profile in one of ``browser``'s)."""
    # Owned first (no CAP_FOWNER here: root may chmod only what it owns), then handed over. Made
    # before anything of the agent's runs: /tmp is the agent's to write in too.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.is_symlink():
        raise RuntimeError(f"{directory} is a symbolic link")
    os.chown(directory, os.getuid(), os.getgid())
    directory.chmod(0o700)
    os.chown(directory, uid, gid)


def _x11_dir() -> None:
    # Xvfb, started later as corral, needs the sticky socket directory and may not make it itself.
    X11_DIR.mkdir(mode=0o1777, exist_ok=True)
    X11_DIR.chmod(0o1777)


def supervisor_env(env: Mapping[str, str], home: str) -> dict[str, str]:
    return {**env, "HOME": home, "USER": USER, "LOGNAME": USER}


def drop_argv(target: list[str]) -> list[str]:
    """setpriv: become corral with no supplementary groups and, in every set, only the three
    capabilities the supervisor needs to start its children with none (see the module's text)."""
    keep = ",".join(f"+{cap}" for cap in SUPERVISOR_CAPS)
    return [
        SETPRIV,
        f"--reuid={USER}",
        f"--regid={USER}",
        "--clear-groups",
        f"--inh-caps=-all,{keep}",
        f"--ambient-caps=-all,{keep}",
        f"--bounding-set=-all,{keep}",
        "--no-new-privs",
        "--",
        *target,
    ]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # -P, and / as the working directory from here on: the image's is the agent's home, and a Python
    # started there would look there first for whatever it imports (the agent's files, run as this
    # process's uid: the init keeps SETUID, the launcher acts as the agent, the controller reads the
    # secret). Each child of the init inherits both.
    target = ["/usr/bin/tini", "--", sys.executable, "-P", "-m", "corral.sandbox.startup.init"]
    if os.getuid() != 0:
        log.error("the sandbox must start as root (it drops to its users itself): run it with --user root")
        return 3
    try:
        no_new_privileges()
        users = Users.of_image()
        own_tmpfs_mounts(TMPFS_OWNERS)
        lock_down(os.environ, users)
        seed_agent_dirs(users)
    except (RuntimeError, ValueError, OSError, KeyError) as exc:
        log.error("cannot lock the sandbox down, refusing to start: %s", exc)
        return 3
    argv = drop_argv(target)
    os.chdir("/")
    os.execvpe(argv[0], argv, supervisor_env(os.environ, users.controller_home))


if __name__ == "__main__":
    sys.exit(main())
