"""``corral do``, ``screenshot`` and ``exec``: one message to a session, its screen, a command in it."""

from __future__ import annotations

import base64
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from websockets.exceptions import ConnectionClosed, WebSocketException

from corral import commands
from corral.cli import common
from corral.client import Frame, check_reply, image_bytes, is_reply
from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CorralError, ErrorCode


def _session_action(session_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One message through the gateway's HTTP route, the API key in its header (never in an address:
    the gateway takes ``?token=`` on a WebSocket only, and only a session token there)."""
    with common.gateway_call() as gateway:
        return gateway.act(session_id, payload)


def _image_paths(output: Path) -> Iterator[Path]:
    """Where a reply's images go, in order: ``output`` itself, then ``NAME-2.png``, ``NAME-3.png``, ... beside it."""
    yield output
    for n in itertools.count(2):
        yield output.with_name(f"{output.stem}-{n}{output.suffix}")


def _strip_images(reply: dict[str, Any], output: Path | None) -> dict[str, Any]:
    """The reply with each image's base64 replaced by its size (and where it went, with ``output``:
    :func:`_image_paths`): the native screenshot, and those of a vendor's result (a ``tool_result``'s
    image blocks, a ``computer_call_output``'s data URL)."""
    paths = _image_paths(output) if output is not None else None
    shot = reply.get("screenshot")
    if isinstance(shot, dict) and "data" in shot:
        _strip(shot, base64.b64decode(shot.pop("data")), paths)
    result = reply.get("result")
    tool_result = result.get("tool_result") if isinstance(result, dict) else None
    blocks = tool_result.get("content") if isinstance(tool_result, dict) else None
    for block in blocks if isinstance(blocks, list) else []:
        source = block.get("source") if isinstance(block, dict) else None
        if isinstance(source, dict) and isinstance(source.get("data"), str):
            _strip(source, base64.b64decode(source.pop("data")), paths)
    item = result.get("item") if isinstance(result, dict) else None
    screen = item.get("output") if isinstance(item, dict) else None
    if isinstance(screen, dict) and str(screen.get("image_url", "")).startswith("data:"):
        head, _, data = screen.pop("image_url").partition(",")
        screen["image_url"] = f"{head},..."
        _strip(screen, base64.b64decode(data), paths)
    return reply


def _strip(holder: dict[str, Any], data: bytes, paths: Iterator[Path] | None) -> None:
    if paths is not None:
        output = next(paths)
        output.write_bytes(data)
        holder["saved_to"] = str(output)
    holder["bytes"] = len(data)


def do(
    session_id: str,
    message: Annotated[
        str,
        typer.Argument(
            help="A native action, or a whole message ('action'/'anthropic'/'openai': a vendor's tool_use block "
            "or output item too)."
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Write the reply's image here; a second and later image (a tool_result holding several) go "
            "beside it as NAME-2.png, NAME-3.png, ...",
        ),
    ] = None,
) -> None:
    """Send one message to a session and print the reply (its images go to --output, numbered after the first)."""
    try:
        payload = json.loads(message)
    except json.JSONDecodeError as exc:
        raise common.fail(f"not JSON: {exc}", 2) from None
    if not isinstance(payload, dict):
        raise common.fail("the message must be a JSON object (an action, or one with 'action'/'anthropic'/'openai')", 2)
    if not ({"action", "anthropic", "openai"} & payload.keys()):
        payload = {"action": payload}
    if output is not None and "screenshot" not in payload and "action" in payload:
        payload["screenshot"] = True
    reply = _session_action(session_id, payload)
    typer.echo(json.dumps(_strip_images(reply, output), ensure_ascii=False))
    if not reply.get("ok"):
        raise typer.Exit(1)


def screenshot(
    session_id: str,
    output: Annotated[Path, typer.Option("-o", "--output")] = Path("shot.png"),
    fmt: Annotated[str, typer.Option("--format")] = "png",
) -> None:
    """Save a screenshot of a session."""
    reply = _session_action(session_id, {"action": {"type": "screenshot", "format": fmt}})
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise common.fail(f"{error.get('code')}: {error.get('message')}")
    output.write_bytes(image_bytes(reply))
    common.console.print(f"saved {output}")


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise common.fail(f"--env takes NAME=VALUE, not {item!r}", 2)
        pairs[name] = value
    return pairs


def _stdin_bytes(source: Path | None) -> bytes | None:
    if source is None:
        return None
    return sys.stdin.buffer.read() if str(source) == "-" else source.read_bytes()


def _print_output(frames: Iterable[Frame]) -> ExecResult:
    """Each chunk to this process's stdout or stderr as it comes; the command's result. Output that
    came only in the reply (none streamed on that stream) is printed from it."""
    streamed: set[str] = set()
    for frame in frames:
        if is_reply(frame):
            result = ExecResult.from_result(check_reply(frame)["result"])
            for name, data in (("stdout", result.stdout_bytes), ("stderr", result.stderr_bytes)):
                if name not in streamed and data:
                    _write_stream(name, data)
            return result
        chunk = OutputChunk.from_event(frame)
        streamed.add(chunk.stream)
        _write_stream(chunk.stream, chunk.bytes)
    raise common.fail("the connection ended before the command's result")


def _write_stream(name: str, data: bytes) -> None:
    target = sys.stderr if name == "stderr" else sys.stdout
    target.flush()
    target.buffer.write(data)
    target.buffer.flush()


# Exit codes for commands that could not start, as a shell gives them.
_START_FAILURES: dict[str, int] = {ErrorCode.PROGRAM_NOT_FOUND: 127, ErrorCode.PERMISSION_DENIED: 126}


def exec_command(
    session_id: str,
    argv: Annotated[list[str] | None, typer.Argument(help="The program and its arguments (after --).")] = None,
    sh: Annotated[str | None, typer.Option("--sh", help="A shell command string, run by bash -lc.")] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory (default /workspace).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE (repeat).")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds; then the whole tree is killed (exit 124).")] = None,
    stdin: Annotated[
        Path | None, typer.Option("--stdin", help="A file for the command's stdin ('-': this one's).")
    ] = None,
) -> None:
    """Run a command in a session as the agent: `corral exec ID -- ls -la` or `corral exec ID --sh 'make | tail'`.

    Its output is streamed as it comes (stdout and stderr apart); its exit code becomes this one's
    (124 when it ran out of time, 128+N when a signal N ended it)."""
    if (sh is None) == (not argv):
        raise common.fail("give a command after -- (argv), or --sh 'a shell string', not both", 2)
    action = commands.exec_action(
        sh,
        argv if sh is None else None,
        cwd=cwd,
        env=_env_pairs(env),
        stdin=_stdin_bytes(stdin),
        timeout_ms=None if timeout is None else max(1, int(timeout * 1000)),
        max_output_bytes=0,  # the events carry every byte; the reply need not repeat them
        output_encoding="base64",  # the bytes as printed, whatever they are
        stream=True,
    )
    try:
        with common.sandbox_client(session_id) as client:
            result = _print_output(client.stream({"action": action}))
    except ActionFailed as exc:
        raise common.fail(str(exc), _START_FAILURES.get(exc.code, 1)) from None
    except ConnectionClosed as exc:  # the gateway refused the session (4401/4403/4404), or it ended
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        raise common.fail(f"the session's connection closed: {reason or exc}") from None
    except (OSError, CorralError, WebSocketException) as exc:
        raise common.fail(f"cannot run the command: {exc}") from None
    if result.timed_out:
        common.console.print(f"[red]timed out after {timeout} s; the command and its children were killed[/red]")
    raise typer.Exit(result.exit_status())
