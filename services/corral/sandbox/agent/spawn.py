"""Starting an agent process (the ``exec`` action's first half): its limits and environment checked,
its stdio made (pipes, a socket pair or a terminal), the launcher asked to spawn it, and a refusal
named after the field that caused it. :class:`Spawner` hands the started :class:`Process` to the
table (:class:`corral.sandbox.agent.processes.ProcessTable`), which keeps it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass

from corral.errors import ActionError, ErrorCode, os_error
from corral.protocol import actions as a
from corral.sandbox.agent import agentenv
from corral.sandbox.agent.launcher import LauncherClient, Spawned, SpawnRefused
from corral.sandbox.agent.launcher import messages as lm
from corral.sandbox.agent.output import Budget, Capture, RingPool
from corral.sandbox.agent.process import Output, Process, oom_kills, set_size
from corral.sandbox.placeholders import Placeholders
from corral.sandbox.sessionenv import SessionEnv


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """Defaults and caps of the process actions (from ControllerSettings)."""

    exec_timeout_ms: int = 60_000
    max_timeout_ms: int = 600_000
    output_bytes: int = 1 << 20
    max_output_bytes: int = 8 << 20
    buffer_bytes: int = 4 << 20
    # All the rings together, and all foreground execs' captures together: the agent's processes,
    # however many, cost the controller at most these (the sandbox's memory is the agent's too).
    buffers_total_bytes: int = 64 << 20
    captures_total_bytes: int = 64 << 20
    max_processes: int = 256
    keep_finished: int = 64
    proxy: str = ""  # the session's egress proxy (host:port), or empty
    ca_bundle: str | None = None


class Spawner:
    """Starts processes through the launcher, each with its ring buffers (from ``rings``) and, for a
    foreground exec, its captures (from ``captures``)."""

    def __init__(
        self,
        launcher: LauncherClient,
        settings: ProcessSettings,
        placeholders: Placeholders,
        rings: RingPool,
        captures: Budget,
        session_env: SessionEnv | None = None,
    ) -> None:
        self._launcher = launcher
        self._settings = settings
        # The session's secret placeholders: each exec's environment gets those of the moment it starts.
        self._placeholders = placeholders
        # The session's env (PUT /v1/env), likewise of the moment each exec starts.
        self._session_env = SessionEnv() if session_env is None else session_env
        self._rings = rings
        self._captures = captures
        self._template_env = agentenv.template_environment()  # read once: the image does not change

    def limits(self, action: a.Exec) -> tuple[int, int]:
        """The exec's timeout and output cap (its own or the defaults), refused over the caps."""
        timeout = action.timeout_ms or self._settings.exec_timeout_ms
        if timeout > self._settings.max_timeout_ms:
            raise ActionError(
                ErrorCode.INVALID_FIELD, f"timeout_ms is at most {self._settings.max_timeout_ms}", "action.timeout_ms"
            )
        output = self._settings.output_bytes if action.max_output_bytes is None else action.max_output_bytes
        if output > self._settings.max_output_bytes:
            message = f"max_output_bytes is at most {self._settings.max_output_bytes}"
            raise ActionError(ErrorCode.INVALID_FIELD, message, "action.max_output_bytes")
        return timeout, output

    def command_environment(self, action_id: str) -> dict[str, str]:
        """What every command the action ``action_id`` starts is told (agentenv), with the session's
        env and placeholders of this moment."""
        settings = self._settings
        return agentenv.command_environment(
            settings.proxy,
            settings.ca_bundle,
            action_id,
            self._placeholders.by_name,
            session_env=self._session_env.by_name,
            template=self._template_env,
        )

    def _environment(self, action: a.Exec, action_id: str) -> list[bytes]:
        env = self.command_environment(action_id)
        env["TERM"] = "xterm-256color" if action.pty else "dumb"
        env.update(action.env)
        return [f"{name}={value}".encode() for name, value in env.items()]

    def check_size(self, action: a.Exec, action_id: str) -> None:
        """What the launcher's one message must hold (base64 and JSON grow it, the session's
        environment adds to it), checked here so the agent hears which field is too big."""
        argv = [os.fsencode(arg) for arg in action.program()]
        size = lm.spawn_size(argv, self._environment(action, action_id), os.fsencode(action.cwd))
        if size <= lm.MAX_MESSAGE:
            return
        env_size = sum(len(f"{name}={value}".encode()) for name, value in action.env.items())
        field_name = "action.env" if env_size > sum(map(len, argv)) else program_field(action)
        message = f"the command, its env and cwd take {size} bytes in the launcher's message; at most {lm.MAX_MESSAGE}"
        raise ActionError(ErrorCode.INVALID_FIELD, f"{message} (pass data through stdin or a file)", field_name)

    async def start(
        self, action: a.Exec, action_id: str, capture: int | None, *, stdin_socket: bool = False
    ) -> Process:
        """The process, started (not yet read from: :meth:`Process.watch_outputs`)."""
        ours, theirs = await self._stdio(action, stdin_socket=stdin_socket)
        try:
            spawned = await self._launcher.spawn(
                [os.fsencode(arg) for arg in action.program()],
                self._environment(action, action_id),
                os.fsencode(action.cwd),
                theirs,
                pty=action.pty is not None,
            )
        except BaseException as exc:
            _close_all(ours)
            if isinstance(exc, ConnectionError):
                raise ActionError(ErrorCode.EXEC_FAILED, f"commands cannot run: {exc}") from None
            if isinstance(exc, OSError):
                raise _start_error(exc) from None
            raise
        finally:
            _close_all(set(theirs))
        if isinstance(spawned, SpawnRefused):
            _close_all(ours)
            raise _refusal(spawned, action)
        return self._process(spawned, action, action_id, ours, capture)

    async def _stdio(self, action: a.Exec, *, stdin_socket: bool = False) -> tuple[list[int], tuple[int, int, int]]:
        """(the controller's ends: stdin, stdout, stderr or [master]; the child's: stdin, stdout, stderr)."""
        if action.pty is not None:
            try:
                master, slave = await self._launcher.openpty()
            except ConnectionError as exc:
                raise ActionError(ErrorCode.EXEC_FAILED, f"commands cannot run: {exc}") from None
            except OSError as exc:
                raise os_error(exc, what="opening a terminal") from None
            set_size(master, action.pty.rows, action.pty.cols)
            os.set_blocking(master, False)
            return [master], (slave, slave, slave)
        out_r, out_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(out_w, True)
        os.set_blocking(err_w, True)
        if stdin_socket:
            pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec, as Python makes them
            in_w, in_r = (end.detach() for end in pair)
            os.set_blocking(in_w, False)
        elif action.background or action.stdin_bytes() is not None:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(in_w, False)
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        ours = [in_w, out_r, err_r] if in_w >= 0 else [out_r, err_r]
        return ours, (in_r, out_w, err_w)

    def _process(
        self, spawned: Spawned, action: a.Exec, action_id: str, ours: list[int], capture: int | None
    ) -> Process:
        size = self._settings.buffer_bytes
        if action.pty is not None:
            (master,) = ours
            stdin: int | None = master
            outputs = {"stdout": Output("stdout", master, self._rings.ring(size))}
        else:
            stdin = ours[0] if len(ours) == 3 else None
            out_r, err_r = ours[-2:]
            outputs = {
                "stdout": Output("stdout", out_r, self._rings.ring(size)),
                "stderr": Output("stderr", err_r, self._rings.ring(size)),
            }
        if capture is not None:
            for output in outputs.values():
                output.capture = Capture(capture, self._captures)
        return Process(
            pid=spawned.pid,
            argv=action.program(),
            command=action.command,
            cwd=action.cwd,
            pty=action.pty is not None,
            background=action.background,
            action_id=action_id,
            control=spawned.control,
            outputs=outputs,
            stdin=stdin,
            oom_before=oom_kills(),
        )


def _start_error(exc: OSError) -> ActionError:
    """No shepherd or no process: the sandbox's process limit, or another failure to start."""
    if exc.errno in (errno.EAGAIN, errno.ENOMEM):
        return ActionError(ErrorCode.PROCESS_LIMIT, f"no room for another process: {exc.strerror}")
    return ActionError(ErrorCode.EXEC_FAILED, f"the command could not be started: {exc.strerror or exc}")


def _refusal(refused: SpawnRefused, action: a.Exec) -> ActionError:
    """A program that never ran, as the action's failure, blamed on the field that caused it."""
    if refused.stage == "cwd":
        return os_error(refused.error(), field="action.cwd", what=f"cwd {action.cwd!r}")
    program = action.program()[0]
    field_name = program_field(action)
    if refused.stage == "exec" and refused.errno == errno.ENOENT:
        return ActionError(ErrorCode.PROGRAM_NOT_FOUND, f"{program!r}: no such program on PATH", field_name)
    if refused.stage == "exec" and refused.errno == errno.EACCES:
        return ActionError(ErrorCode.PERMISSION_DENIED, f"{program!r}: permission denied", field_name)
    reason = os.strerror(refused.errno)
    if refused.errno == errno.EAGAIN:
        return ActionError(ErrorCode.PROCESS_LIMIT, f"could not start {program!r}: {reason}")
    return ActionError(ErrorCode.EXEC_FAILED, f"could not start {program!r} ({refused.stage}): {reason}", field_name)


def program_field(action: a.Exec) -> str:
    return "action.argv" if action.argv is not None else "action.command"


def _close_all(fds: list[int] | set[int]) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
