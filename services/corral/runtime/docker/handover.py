"""What a sandbox's controller is handed and what is read back from it: the files mounted for it
(its uid's to read), and its per-boot secret: made here for each start and mounted for its uid (the
swarm driver's way: no exec on the start's path, docs/design/0435), or, where the runtime has no
directory to hand it over through, read as its uid with one bounded exec once boot's log says it is
written (and so for a sandbox adopted after a gateway's restart)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types

from corral.contracts import auth
from corral.errors import SandboxError
from corral.runtime.docker.engine import (
    _INIT_LOGS,
    CONTROLLER_UID,
    CONTROLLER_USER,
    GIVEN_SECRET_PREFIX,
    Engine,
)
from corral.runtime.types import (
    SandboxAddress,
)

log = logging.getLogger(__name__)

# Boot's word for "the runtime mounted the controller's secret at auth.SECRET_FILE: check it, make
# none" (corral.sandbox.startup.boot.SECRET_GIVEN; the swarm driver sets it too).
SECRET_GIVEN_ENV = "CORRAL_SECRET_GIVEN"


@dataclass(frozen=True, slots=True)
class GivenSecret:
    """A controller secret made for one start, in a host file of the controller's uid (0400) alone in
    a directory of root's (0700), mounted read-only at :data:`auth.SECRET_FILE`."""

    secret: str = field(repr=False)  # as SandboxAddress's: never in a log or a traceback's repr
    host_file: Path

    def options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``containers.run``'s options with the file mounted and boot told so."""
        volumes = {**options["volumes"], str(self.host_file): {"bind": str(auth.SECRET_FILE), "mode": "ro"}}
        environment = {**options["environment"], SECRET_GIVEN_ENV: "1"}
        return {**options, "volumes": volumes, "environment": environment}


class _LogWatch:
    """One container's log followed (on the caller's thread of choice) until one of ``marks`` shows,
    the log ends or ``stop``: even the opening happens on that thread, since a daemon that hangs
    would hold it past any deadline."""

    def __init__(self, client: docker.DockerClient, ident: str, marks: tuple[bytes, ...]) -> None:
        self._client, self._ident, self._marks = client, ident, marks
        self._lock = threading.Lock()
        self._stream: Any = None
        self._stopped = False
        self.seen: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            stream = self._client.api.logs(self._ident, stream=True, follow=True)
        except Exception:  # refused, or no daemon to ask (docker-py raises requests' errors as well)
            self.seen.put(False)
            return
        with self._lock:
            self._stream, stopped = stream, self._stopped
        if stopped:  # opened after the caller gave up
            _close_quietly(stream)
            self.seen.put(False)
            return
        tail = b""
        try:
            for chunk in stream:
                tail = (tail + chunk)[-4096:]  # a mark may be split across chunks
                if any(mark in tail for mark in self._marks):
                    self.seen.put(True)
                    return
        except Exception:  # closed under it by stop, or the daemon went away
            pass
        self.seen.put(False)

    def stop(self) -> None:
        with self._lock:
            self._stopped, stream = True, self._stream
        if stream is not None:
            _close_quietly(stream)


def _close_quietly(stream: Any) -> None:
    """Close a followed log that may have ended already or lost its daemon (over SSH, docker-py's
    close raises its own error)."""
    with contextlib.suppress(OSError, AttributeError, docker.errors.DockerException):
        stream.close()


class Handover(Engine):
    """Files to the controller's uid, its secret back; each wait bounded (a daemon can hang)."""

    def _hand_to_controller(self, files: Mapping[str, str]) -> None:
        """Files mounted into a sandbox are its controller's uid's to read (0600, read-only mount):
        the agent's uid cannot."""
        if not files:
            return
        if os.geteuid() != 0:
            log.warning("not root: the sandbox's controller cannot read what is mounted for it (%s)", ", ".join(files))
            return
        for host in files:
            owner = self.host_root + CONTROLLER_UID
            os.chown(host, owner, owner, follow_symlinks=False)

    @contextlib.contextmanager
    def _given_secret(self) -> Iterator[GivenSecret | None]:
        """A fresh secret for one start's mount, its file removed once the start is done (the mount
        keeps what it mounted; nothing restarts a sandbox): on the host only while Docker mounts it.
        None where it cannot be given: no directory to give it through, or a gateway not root, which
        cannot hand a file to the controller's uid."""
        if self.handover_dir is None or os.geteuid() != 0:
            yield None
            return
        self.handover_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix=GIVEN_SECRET_PREFIX, dir=self.handover_dir))  # 0700, root's
        try:
            secret = auth.new_secret()
            host_file = directory / auth.SECRET_FILE.name
            fd = os.open(host_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            try:
                os.write(fd, secret.encode() + b"\n")
                owner = self.host_root + CONTROLLER_UID
                os.fchown(fd, owner, owner)
            finally:
                os.close(fd)
            yield GivenSecret(secret, host_file)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            if directory.exists():  # said, not silent: it holds a live sandbox's secret until removed
                log.error(
                    "could not remove %s, a start's controller secret; the next start of the gateway will", directory
                )

    def read_secret(self, address: SandboxAddress, wait_s: float) -> SandboxAddress:
        """The address with its controller's per-boot secret, read inside the container as the
        controller's uid (the only one that may read it), the moment boot has written it."""
        deadline = time.monotonic() + wait_s
        # One exec, once boot says the file is there; an image whose boot does not say so is read when
        # its init logs (boot is done by then), or by the retries below when neither shows.
        if wait_s > 0:
            self.wait_for_log(address.id, (auth.SECRET_WRITTEN.encode(), _INIT_LOGS), wait_s)
        while True:
            try:
                code, out = self._exec_within(
                    address.id, ["cat", str(auth.SECRET_FILE)], CONTROLLER_USER, max(deadline - time.monotonic(), 1.0)
                )
            except TimeoutError:
                raise SandboxError(
                    f"sandbox {address.name} did not answer an exec in {wait_s:.0f}s:\n{self.logs(address.id, 40)}"
                ) from None
            except docker.errors.APIError as exc:
                # Boot refusing to start (a firewall it cannot set) ends the container before the first
                # exec: say why, from its log, rather than "409 container is not running".
                if self._container(address.id).status in ("exited", "dead"):
                    raise SandboxError(
                        f"sandbox {address.name} exited while starting:\n{self.logs(address.id, 40)}"
                    ) from None
                raise SandboxError(f"cannot read the controller's secret in {address.name}: {exc}") from None
            if code == 0:
                secret = out.decode(errors="replace").strip()
                return SandboxAddress(address.id, address.name, address.host, address.port, secret)
            if time.monotonic() > deadline or self._container(address.id).status in ("exited", "dead"):
                raise SandboxError(
                    f"sandbox {address.name} wrote no controller secret in {wait_s:.0f}s:\n{self.logs(address.id, 40)}"
                )
            time.sleep(0.02)

    def wait_for_log(self, ident: str, marks: tuple[bytes, ...], timeout_s: float) -> bool:
        """Whether the container's log shows one of ``marks`` within ``timeout_s``; False at the log's
        end (the container stopped), the deadline, or a daemon that will not follow it. A hint of when
        to look, never trusted for more: what the log says is checked by whatever the caller does next."""
        watch = _LogWatch(self.client, ident, marks)
        threading.Thread(target=watch.run, name=f"corral-log-{ident[:12]}", daemon=True).start()
        try:
            return watch.seen.get(timeout=timeout_s)
        except queue.Empty:
            return False
        finally:
            watch.stop()

    def _exec_within(self, ident: str, argv: list[str], user: str, timeout_s: float) -> tuple[int, bytes]:
        """``docker exec`` that gives up after ``timeout_s``: docker-py reads an exec's output with no
        timeout, and an exec into a container that is exiting can hang for good (seen under runsc). The
        reader thread is a daemon and ends when the caller removes the container."""
        answer: queue.SimpleQueue[tuple[int, bytes] | BaseException] = queue.SimpleQueue()

        def run() -> None:
            try:
                code, out = self._container(ident).exec_run(argv, user=user, stderr=False)
                answer.put((int(code), out))
            except BaseException as exc:  # handed to the caller, who re-raises it
                answer.put(exc)

        threading.Thread(target=run, name=f"corral-exec-{ident[:12]}", daemon=True).start()
        try:
            result = answer.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"exec {argv[0]} in {ident[:12]} gave no answer in {timeout_s:.1f}s") from None
        if isinstance(result, BaseException):
            raise result
        return result
