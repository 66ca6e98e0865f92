"""``corral run-code`` (a cell in a session's kernel: its output as it comes, its results as text, its
images to files) and ``corral code contexts/restart/rm`` (the kernels a session keeps)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, TypeVar, cast

import typer
from rich.table import Table
from websockets.exceptions import ConnectionClosed, WebSocketException

from corral.cli import common
from corral.client import Frame, is_reply
from corral.errors import ActionFailed, CorralError
from corral.sdk.execution import Execution, OutputMessage, Result
from corral.sdk.messages import Message, code_event, messages

code_app = typer.Typer(
    help="A session's code contexts: the kernels `run-code` keeps (docs/code.md).", no_args_is_help=True
)

T = TypeVar("T")
DEFAULT_CODE_CONTEXT = "default"  # protocol.actions' (not imported: it needs the server's python-xlib)
TIMED_OUT = 124  # as `corral exec` and timeout(1) give it


def _code_text(code: str | None, file: Path | None) -> str:
    """The cell: the argument, a file, or this process's stdin (``-``, or neither given)."""
    if code is not None and file is not None:
        raise common.fail("give the code as an argument or --file, not both", 2)
    if file is not None and str(file) != "-":
        try:
            return file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise common.fail(f"cannot read {file}: {exc}", 2) from None
    if code is not None and code != "-":
        return code
    return sys.stdin.read()


class Printer:
    """What a cell shows on this terminal: printed chunks to stdout/stderr as they come, each result's
    text, each image written to ``images`` (or named with its size), every result once."""

    def __init__(self, images: Path | None) -> None:
        self.images = images
        self.saved: list[Path] = []
        self.shown = 0  # results shown from the stream
        self.streamed: set[str] = set()

    def chunk(self, message: OutputMessage) -> None:
        name = "stderr" if message.error else "stdout"
        self.streamed.add(name)
        _write(name, message.line)

    def result(self, result: Result) -> None:
        image = result.image_bytes()
        if image is None:
            text = result.text if result.text is not None else result.markdown or result.html or ""
            _write("stdout", text if text.endswith("\n") else text + "\n")
        else:
            self.image(*image)

    def image(self, kind: str, data: bytes) -> None:
        if self.images is None:
            _write("stderr", f"[{kind} image, {len(data)} bytes: --save-images DIR writes it]\n")
            return
        path = self.images / f"result-{len(self.saved) + 1}.{kind}"
        path.write_bytes(data)
        self.saved.append(path)
        _write("stderr", f"[{kind} image, {len(data)} bytes: {path}]\n")

    def ended(self, execution: Execution) -> None:
        """What the reply holds that the stream did not show."""
        for name, chunks in (("stdout", execution.logs.stdout), ("stderr", execution.logs.stderr)):
            if name not in self.streamed:
                _write(name, "".join(chunks))
        for result in () if self.shown else execution.results:  # a sandbox that streamed none
            self.result(result)
        if execution.error is not None:
            _write("stderr", execution.error.traceback or f"{execution.error.name}: {execution.error.value}")
            _write("stderr", "\n")
        if execution.state_lost:
            common.console.print("[yellow]the context's kernel was restarted: its variables are gone[/yellow]")


def _write(name: str, text: str) -> None:
    target = sys.stderr if name == "stderr" else sys.stdout
    target.write(text)
    target.flush()


def _shown(frames: Iterable[Frame], message: Message[Execution], printer: Printer) -> Execution:
    for frame in frames:
        if is_reply(frame):
            execution = message.read(frame)
            printer.ended(execution)
            return execution
        event = code_event(frame)
        if isinstance(event, Result):
            printer.shown += 1
            printer.result(event)
        else:
            printer.chunk(event)
    raise common.fail("the connection ended before the cell's result")


def _exit_code(execution: Execution) -> int:
    if execution.timed_out:
        return TIMED_OUT
    return 0 if execution.error is None else 1


def run_code(
    session_id: str,
    code: Annotated[str | None, typer.Argument(help="The code ('-' or none: read from stdin).")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the code from this file.")] = None,
    context: Annotated[
        str, typer.Option(help="The context (kernel) to run in; each keeps its own state.")
    ] = DEFAULT_CODE_CONTEXT,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds; then the cell is interrupted, the kernel kept (exit 124).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole result as JSON, at its end.")] = False,
    save_images: Annotated[
        Path | None, typer.Option("--save-images", help="Write image results here (result-N.png, .jpeg, .svg).")
    ] = None,
) -> None:
    """Run code in a session's kernel, whose variables last between calls: `corral run-code ID 'x = 1'`.

    Printed output comes as the cell prints it, then each result as text (images to --save-images);
    an exception's traceback goes to stderr and exits 1, a timeout 124."""
    source = _code_text(code, file)
    if save_images is not None:
        save_images.mkdir(parents=True, exist_ok=True)
    timeout_ms = None if timeout is None else max(1, int(timeout * 1000))
    message = messages.run_code(source, "python", context, timeout_ms, stream=not as_json)
    printer = Printer(save_images)
    try:
        with common.sandbox_client(session_id) as client:
            if as_json:
                reply = client.request(message.body)
                execution = message.read(reply)
                typer.echo(json.dumps(reply["result"], ensure_ascii=False))
                for image in filter(None, (result.image_bytes() for result in execution.results)):
                    printer.image(*image)
            else:
                execution = _shown(client.stream(message.body), message, printer)
    except ActionFailed as exc:
        raise common.fail(str(exc)) from None
    except ConnectionClosed as exc:  # the gateway refused the session (4401/4403/4404), or it ended
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        raise common.fail(f"the session's connection closed: {reason or exc}") from None
    except (OSError, CorralError, WebSocketException) as exc:
        raise common.fail(f"cannot run the code: {exc}") from None
    if execution.timed_out:
        common.console.print(f"[red]timed out after {timeout} s: the cell was interrupted[/red]")
    raise typer.Exit(_exit_code(execution))


def _act(session_id: str, message: Message[T]) -> T:
    with common.gateway_call() as gateway:
        reply = gateway.act(session_id, dict(message.body))
    try:
        return message.read(cast(Frame, reply))  # the gateway's JSON, read as the action's model
    except (ActionFailed, CorralError) as exc:
        raise common.fail(str(exc)) from None


@code_app.command("contexts")
def contexts(session_id: str) -> None:
    """The session's code contexts (a kernel each) and their state."""
    listed = _act(session_id, messages.list_code_contexts())
    if not listed:
        common.console.print("no code contexts: the first run-code starts one")
        return
    table = Table("context", "language", "state", "pid", "executions", "started")
    for info in listed:
        table.add_row(
            info.name, info.language, info.state, str(info.pid), str(info.execution_count), common.when(info.started)
        )
    common.out.print(table)


@code_app.command("restart")
def restart(session_id: str, context: Annotated[str, typer.Argument()] = DEFAULT_CODE_CONTEXT) -> None:
    """Start a context's kernel afresh (its variables are gone)."""
    info = _act(session_id, messages.restart_code_context(context))
    common.console.print(f"restarted {info.name} (pid {info.pid})")


@code_app.command("rm")
def remove(session_id: str, context: Annotated[str, typer.Argument()] = DEFAULT_CODE_CONTEXT) -> None:
    """Stop a context's kernel and forget it."""
    removed = _act(session_id, messages.remove_code_context(context))
    common.console.print(f"removed {removed.name}" if removed.removed else f"no context {removed.name} was running")
