"""Starts one Jupyter kernel for run_code. Run as a script by the agent's ``python3`` (Debian's, with
the agent's ``pip install --user`` packages), as the agent, through the launcher like any ``exec``;
never imported by the controller.

The kernel's HMAC key comes on stdin (one JSON line, ``{"key": ..., "tag": ...}``), never in argv or the
environment, where any process could read it. It goes into a connection file of mode 0600 in a
fresh 0700 directory (ipykernel reads its key from a file), which is removed once the kernel has
read it. The kernel binds free ports on 127.0.0.1 itself (no race for a port picked by another
process) and this prints them on its stdout for the controller, after the line's ``tag`` (the
controller's, new for each start: what else the kernel prints as it starts is never taken for it).
"""

import sys

# This file's directory is the controller's package: none of its modules may shadow the kernel's.
del sys.path[0]

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

MAX_KEY_LINE = 4096


def main() -> None:
    given = json.loads(sys.stdin.buffer.readline(MAX_KEY_LINE))
    key, tag = given["key"], given["tag"]
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)  # the kernel's own stdin is nothing (input() is refused: allow_stdin is false)
    os.close(stdin)
    report = os.dup(1)  # ipykernel takes fd 1 over for the cells' output: the ports go out first
    runtime = tempfile.mkdtemp(prefix="corral-kernel-")
    path = os.path.join(runtime, "kernel.json")
    info = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        **dict.fromkeys(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"), 0),
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(info, fh)

    from ipykernel.kernelapp import IPKernelApp  # type: ignore[import-not-found]  # the agent's Python's

    app = IPKernelApp.instance()
    app.initialize(["-f", path, "--HistoryManager.enabled=False", "--IPKernelApp.log_level=WARN"])
    shutil.rmtree(runtime, ignore_errors=True)  # the key is in memory now
    app.connection_file = os.path.join(runtime, "gone.json")  # nothing to clean up at exit
    ports = {"shell": app.shell_port, "iopub": app.iopub_port, "control": app.control_port}
    os.write(report, f"\n{tag} {json.dumps(ports)}\n".encode())
    os.close(report)
    app.start()


if __name__ == "__main__":
    main()
