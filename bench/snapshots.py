"""Checkpoint and restore of a running Corral sandbox with CRIU, against a second engine (docs/snapshots.md).

Needs the experimental engine of ``bench/criu-engine.sh up corral-desktop:TAG`` (its own socket, data
root and containerd, CRIU 4.1, userns-remap). Each round starts a sandbox with the gateway's own
hardened options (``sandbox_options``: read-only root, tmpfs mounts, every capability dropped but
boot's, no-new-privileges) on ``--network none``, puts state in it (two tabs, files in ``/workspace``
and ``/home/agent``, a background process ticking twice a second), then measures:

- ``docker pause`` / ``unpause`` (the cgroup freezer), the baseline: times, memory held while frozen;
- ``checkpoint`` (the container exits): time, size on disk, the memory it held;
- restore into the same container: time to the API's answer, to ``/healthz``, and what survived
  (the screenshot byte for byte, the tabs, the per-boot secret, the files, the ticking process, the
  DevTools link);
- ``checkpoint --leave-running``: time and size;
- restore into a NEW container (``create`` + ``start --checkpoint-dir``), as a cold start from a
  snapshot would: the same checks.

The controller is reached on its loopback through the sandbox's network namespace (a socket made in
a thread that entered it with setns(2)): nothing is published and no network is made.

    bench/criu-engine.sh up corral-desktop:criu
    PYTHONPATH=services python bench/snapshots.py --image corral-desktop:criu [--rounds 3] [--tcp-established]
    bench/criu-engine.sh down
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import hashlib
import http.client
import json
import os
import shutil
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from docker.models.containers import Container

from corral.contracts import auth
from corral.runtime import SandboxSpec
from corral.runtime.docker.sandboxes import sandbox_options

SOCKET = "unix:///var/run/docker-criu.sock"
CRIU_ROOT = Path(os.environ.get("CRIU_ROOT", "/opt/corral-criu-sid"))
CONTROLLER_PORT = 8765
LABEL = "corral.criu"
INTERNAL_NETWORK = "corral-criu-internal"
CLONE_NEWNET = 0x40000000
PAGE_A = "data:text/html,<title>first</title><h1 style='font:48px serif'>criu tab one</h1>"
PAGE_B = "data:text/html,<title>second</title><h1 style='font:48px serif'>criu tab two</h1>"
# libuv (uvloop's in the controller, node's in the Playwright driver) opens an io_uring for every loop,
# whatever UV_USE_IO_URING says, and CRIU cannot dump one ("Unknown shit 600 (anon_inode:[io_uring])").
# Refused with ENOSYS, libuv falls back to epoll. Docker 20.10's default profile allows io_uring (25.0's
# refuses it); this one allows everything else, so the run shows CRIU's limits, not seccomp's: a
# sandbox that adopted this would take the engine's default profile and refuse these three besides.
NO_IO_URING = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {"names": ["io_uring_setup", "io_uring_enter", "io_uring_register"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    ],
}
TICKER = "while :; do date +%s.%N >> /workspace/ticks; sleep 0.5; done"


# -- the controller, through the sandbox's network namespace -------------------------------------------


def netns_socket(pid: int, port: int, timeout_s: float) -> socket.socket:
    """A TCP socket to ``127.0.0.1:port`` inside the network namespace of ``pid``. A socket keeps the
    namespace it was made in, so only the thread that makes it enters the namespace (and then ends)."""
    out: list[socket.socket | BaseException] = []

    def enter_and_connect() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            with open(f"/proc/{pid}/ns/net", "rb") as ns:
                if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            out.append(socket.create_connection(("127.0.0.1", port), timeout=timeout_s))
        except BaseException as exc:  # handed to the caller's thread
            out.append(exc)

    thread = threading.Thread(target=enter_and_connect)
    thread.start()
    thread.join()
    result = out[0]
    if isinstance(result, BaseException):
        raise result
    return result


class NetnsConnection(http.client.HTTPConnection):
    def __init__(self, pid: int, timeout_s: float) -> None:
        super().__init__("127.0.0.1", CONTROLLER_PORT, timeout=timeout_s)
        self._pid = pid

    def connect(self) -> None:
        self.sock = netns_socket(self._pid, CONTROLLER_PORT, self.timeout or 10.0)


@dataclass
class Controller:
    pid: int
    secret: str

    def healthz(self) -> tuple[int, dict[str, Any]]:
        conn = NetnsConnection(self.pid, 5)
        try:
            conn.request("GET", "/healthz")
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read() or b"{}")
        finally:
            conn.close()

    def act(self, action: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
        signed = auth.sign(self.secret)
        conn = NetnsConnection(self.pid, timeout_s)
        try:
            body = json.dumps({"id": 1, "action": action}).encode()
            conn.request("POST", "/v1/actions", body, {**signed.headers, "content-type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            if not auth.proven(self.secret, signed.nonce, {k.lower(): v for k, v in reply.getheaders()}):
                raise RuntimeError("the reply does not carry the controller's proof")
            out: dict[str, Any] = json.loads(data)
            if not out.get("ok"):
                raise RuntimeError(f"{action['type']}: {out.get('error')}")
            return out
        finally:
            conn.close()

    def wait_healthy(self, timeout_s: float) -> float:
        start = time.monotonic()
        while True:
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                status, body = self.healthz()
                if status == 200 and body.get("ok"):
                    return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"/healthz did not answer 200 in {timeout_s}s")
            time.sleep(0.02)


# -- the engine ------------------------------------------------------------------------------------------


@dataclass
class Engine:
    client: docker.DockerClient
    image: str
    network: str = "none"

    def options(self, name: str) -> dict[str, Any]:
        # Chromium's unsandboxed zygote leaves a message with credentials unread in its socket to the
        # browser, which CRIU cannot dump ("skqueue: Control messages in queue, not supported"); with
        # --no-sandbox (the uid split is the sandbox here) the zygote that is left serves every child.
        environment = {"CORRAL_CHROMIUM_FLAGS": "--no-unsandboxed-zygote"}
        spec = SandboxSpec(
            image=self.image, name=name, network=self.network, labels={LABEL: "1"}, environment=environment
        )
        options = sandbox_options(spec)
        return {**options, "security_opt": [*options["security_opt"], f"seccomp={json.dumps(NO_IO_URING)}"]}

    def checkpoints(self, container: Container) -> Path:
        """Where the engine keeps a container's checkpoints: Docker 20.10 restores from nowhere else
        ("custom checkpointdir is not supported")."""
        return Path(str(self.client.info()["DockerRootDir"])) / "containers" / str(container.id) / "checkpoints"

    def start(self, name: str) -> Container:
        return self.client.containers.run(self.image, detach=True, **self.options(name))

    def create(self, name: str) -> Container:
        return self.client.containers.create(self.image, **self.options(name))

    def checkpoint(self, container: Container, name: str, leave_running: bool) -> float:
        api = self.client.api
        start = time.monotonic()
        reply = api._post_json(  # docker-py has no checkpoint call; the Engine API's own
            api._url("/containers/{0}/checkpoints", container.id),
            data={"CheckpointID": name, "Exit": not leave_running},
        )
        api._raise_for_status(reply)
        return time.monotonic() - start

    def restore(self, container: Container, name: str) -> float:
        api = self.client.api
        start = time.monotonic()
        reply = api._post(api._url("/containers/{0}/start", container.id), params={"checkpoint": name})
        api._raise_for_status(reply)
        return time.monotonic() - start

    def secret(self, container: Container, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            code, out = container.exec_run(["cat", str(auth.SECRET_FILE)], user="corral")
            if code == 0:
                return bytes(out).decode().strip()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no controller secret in {container.name}: {out.decode(errors='replace')}")
            time.sleep(0.2)

    def pid(self, container: Container) -> int:
        container.reload()
        return int(container.attrs["State"]["Pid"])

    def address(self, container: Container) -> str | None:
        """The container's address on its network (None on ``none``): a restore must give it back
        for sockets bound to it."""
        container.reload()
        network = (container.attrs["NetworkSettings"].get("Networks") or {}).get(self.network) or {}
        return str(network.get("IPAddress")) if network.get("IPAddress") else None

    def memory_mib(self, container: Container) -> float:
        """docker stats' figure: the cgroup's usage less its inactive file cache."""
        mem = self.client.api.stats(container.id, stream=False)["memory_stats"]
        extra = mem.get("stats", {})
        return float(mem.get("usage", 0) - extra.get("total_inactive_file", 0)) / 2**20


# -- what a sandbox holds, before and after ----------------------------------------------------------------


@dataclass
class State:
    screenshot_sha: str
    tabs: list[tuple[str, bool]]
    files: dict[str, str]
    ticks: int
    browser: str
    processes: list[int] = field(default_factory=list)


def prepare(ctl: Controller) -> int:
    """Two tabs (the first in front), two files, a background ticker; the ticker's pid."""
    ctl.act({"type": "navigate", "url": PAGE_A})
    ctl.act({"type": "tab_new", "url": PAGE_B})
    ctl.act({"type": "tab_switch", "tab": 0})
    ctl.act({"type": "file_write", "path": "/workspace/criu.txt", "content": "in the workspace"})
    ctl.act({"type": "file_write", "path": "/home/agent/criu.txt", "content": "in the agent's home"})
    pid = int(ctl.act({"type": "exec", "command": TICKER, "background": True})["result"]["pid"])
    time.sleep(2)  # the page painted, a few ticks written
    return pid


def observe(ctl: Controller) -> State:
    shot = ctl.act({"type": "screenshot", "format": "png"})["screenshot"]["data"]
    tabs = [(t["url"], bool(t["active"])) for t in ctl.act({"type": "tabs"})["result"]["tabs"]]
    files = {
        path: ctl.act({"type": "file_read", "path": path})["result"]["content"]
        for path in ("/workspace/criu.txt", "/home/agent/criu.txt")
    }
    ticked = ticks(ctl)
    running = [p["pid"] for p in ctl.act({"type": "process_list"})["result"]["processes"] if p["running"]]
    _, health = ctl.healthz()
    return State(
        hashlib.sha256(base64.b64decode(shot)).hexdigest(), tabs, files, ticked, str(health.get("browser")), running
    )


def ticks(ctl: Controller) -> int:
    return len(ctl.act({"type": "file_read", "path": "/workspace/ticks"})["result"]["content"].splitlines())


def ticking(ctl: Controller, seen: int, within_s: float = 3.0) -> bool:
    """Whether the ticker writes a line past ``seen`` within ``within_s`` (it ticks every 0.5 s): its
    timer fires after the restore, not only before the checkpoint."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ticks(ctl) > seen:
            return True
        time.sleep(0.1)
    return False


def compare(ctl: Controller, before: State, after: State, ticker: int) -> dict[str, bool]:
    return {
        "screenshot_identical": before.screenshot_sha == after.screenshot_sha,
        "tabs_same": before.tabs == after.tabs,
        "files_same": before.files == after.files,
        "ticker_running": ticker in after.processes,
        "ticks_kept": after.ticks >= before.ticks,
        "ticks_went_on": ticking(ctl, after.ticks),
        "devtools_connected": after.browser == "connected",
    }


def size_mib(directory: Path) -> float:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 2**20


def runc_share(verb: str, since: float) -> dict[str, float]:
    """How long runc ran and, of that, CRIU itself (its log's last stamp), for the newest ``verb``
    since ``since``; the rest of the API call is the engine's (containerd packs every checkpoint into
    its content store and unpacks it again to restore)."""
    runs = [d for d in sorted((CRIU_ROOT / "logs").glob(f"*-{verb}-0")) if d.stat().st_mtime >= since]
    if not runs:
        return {}
    began, ended = (float(x) for x in (runs[-1] / "runc-seconds").read_text().split())
    lines = [line for log in runs[-1].glob("*.log") for line in log.read_text(errors="replace").splitlines()]
    stamps = [line[1:10] for line in lines if line[:1] == "("]
    criu = max((float(s) for s in stamps if s.replace(".", "").isdigit()), default=0.0)
    return {"runc_s": ended - began, "criu_s": criu}


def criu_errors(since: float) -> list[str]:
    """CRIU's error lines from the logs the engine's runc wrapper keeps (bench/criu-engine.sh)."""
    lines: list[str] = []
    for log in sorted((CRIU_ROOT / "logs").glob("*/*.log")):
        if log.stat().st_mtime >= since:
            with open(log, errors="replace") as f:
                lines += [
                    f"{log.parent.name}: {line.strip()}"
                    for line in f
                    if "Error" in line and "RLIMIT_NOFILE" not in line
                ]
    return lines[:20]


# -- one round -----------------------------------------------------------------------------------------------


def pause_baseline(engine: Engine, container: Container, ctl: Controller) -> dict[str, float]:
    before = engine.memory_mib(container)
    t = time.monotonic()
    container.pause()
    paused = time.monotonic() - t
    frozen = engine.memory_mib(container)
    t = time.monotonic()
    container.unpause()
    unpaused = time.monotonic() - t
    healthy = ctl.wait_healthy(30)
    return {
        "pause_s": paused,
        "unpause_s": unpaused,
        "unpause_to_healthz_s": unpaused + healthy,
        "memory_mib": before,
        "memory_while_paused_mib": frozen,
    }


def restored(engine: Engine, container: Container, secret: str, tag: str) -> tuple[Controller, float, float]:
    took = engine.restore(container, tag)
    ctl = Controller(engine.pid(container), secret)
    healthy = ctl.wait_healthy(60)
    return ctl, took, took + healthy


def one_round(engine: Engine, n: int) -> dict[str, Any]:
    name = f"corral-criu-{os.getpid()}-{n}"
    out: dict[str, Any] = {}
    began = time.time()
    container = engine.start(name)
    clone: Container | None = None
    try:
        secret = engine.secret(container)
        ctl = Controller(engine.pid(container), secret)
        out["cold_start_to_healthz_s"] = ctl.wait_healthy(120)
        out["address"] = engine.address(container)
        ticker = prepare(ctl)
        before = observe(ctl)
        out["pause"] = pause_baseline(engine, container, ctl)
        out["memory_before_checkpoint_mib"] = engine.memory_mib(container)

        # Checkpoint with --leave-running first (the sandbox goes on), then the one that stops it.
        directory = engine.checkpoints(container)
        out["checkpoint_leave_running_s"] = engine.checkpoint(container, "live", leave_running=True)
        out["checkpoint_leave_running_mib"] = size_mib(directory / "live")
        ctl.wait_healthy(30)
        out["after_leave_running"] = compare(ctl, before, observe(ctl), ticker)
        before = observe(ctl)
        mark = time.time()
        out["checkpoint_s"] = engine.checkpoint(container, "stopped", leave_running=False)
        out["checkpoint_parts"] = runc_share("checkpoint", mark)
        out["checkpoint_mib"] = size_mib(directory / "stopped")
        container.reload()
        out["status_after_checkpoint"] = container.status
        # Kept aside for the new container below: a restore consumes nothing, but the old container
        # and its directory go first, as they would when a paused session's container is removed.
        spare = Path(f"/var/tmp/{name}-stopped")
        shutil.copytree(directory / "stopped", spare)

        mark = time.time()
        ctl, out["restore_api_s"], out["restore_to_healthz_s"] = restored(engine, container, secret, "stopped")
        out["restore_parts"] = runc_share("restore", mark)
        after = observe(ctl)
        out["same_container"] = compare(ctl, before, after, ticker)
        out["secret_unchanged"] = engine.secret(container) == secret
        out["memory_after_restore_mib"] = engine.memory_mib(container)
        out["address_after_restore"] = engine.address(container)

        # A cold start from the snapshot: a new container (the same options), the first one gone.
        container.remove(force=True)
        clone = engine.create(name + "-clone")
        clone_dir = engine.checkpoints(clone)
        clone_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(spare), clone_dir / "stopped")
        ctl, out["clone_restore_api_s"], out["clone_restore_to_healthz_s"] = restored(engine, clone, secret, "stopped")
        out["new_container"] = compare(ctl, before, observe(ctl), ticker)
        out["address_of_new_container"] = engine.address(clone)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["criu_errors"] = criu_errors(began)
    finally:
        for c in (container, clone):
            if c is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    c.remove(force=True)
        shutil.rmtree(f"/var/tmp/{name}-stopped", ignore_errors=True)
    return out


def medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for r in rounds for k, v in r.items() if isinstance(v, float)})
    nested = ("pause", "checkpoint_parts", "restore_parts")
    flat = [{**r, **{f"{n}.{k}": v for n in nested for k, v in r.get(n, {}).items()}} for r in rounds]
    keys += sorted({k for r in flat for k in r if "." in k and k.split(".")[0] in nested})
    return {k: round(statistics.median(r[k] for r in flat if k in r), 3) for k in keys if any(k in r for r in flat)}


@contextlib.contextmanager
def criu_args(tcp_established: bool) -> Iterator[None]:
    """The words bench/criu-engine.sh's runc wrapper adds to ``runc checkpoint`` and ``runc restore``."""
    # runc sets CRIU's file locks flag itself (false unless told): Chromium holds flock()s on its profile.
    extra = "--file-locks --tcp-established\n" if tcp_established else "--file-locks\n"
    for verb in ("checkpoint", "restore"):
        (CRIU_ROOT / f"{verb}-args").write_text(extra)
    try:
        yield
    finally:
        for verb in ("checkpoint", "restore"):
            (CRIU_ROOT / f"{verb}-args").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=os.environ.get("CORRAL_IMAGE", "corral-desktop:latest"))
    parser.add_argument("--socket", default=SOCKET)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tcp-established", action="store_true", help="runc checkpoint/restore --tcp-established")
    parser.add_argument(
        "--internal-network",
        action="store_true",
        help=f"on an internal network of the engine's ({INTERNAL_NETWORK}: a bridge, no iptables) instead of none",
    )
    args = parser.parse_args()
    client = docker.DockerClient(base_url=args.socket, timeout=300)
    network = "none"
    if args.internal_network:
        if not client.networks.list(names=[INTERNAL_NETWORK]):
            client.networks.create(INTERNAL_NETWORK, internal=True, labels={LABEL: "1"})
        network = INTERNAL_NETWORK
    engine = Engine(client, args.image, network)
    rounds = []
    with criu_args(args.tcp_established):
        for n in range(args.rounds):
            result = one_round(engine, n)
            print(json.dumps(result), flush=True)
            rounds.append(result)
    summary = {"tcp_established": args.tcp_established, "network": network, "medians": medians(rounds)}
    print(json.dumps(summary, indent=1))
    sys.exit(0 if all("error" not in r for r in rounds) else 1)


if __name__ == "__main__":
    main()
