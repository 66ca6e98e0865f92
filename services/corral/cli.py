"""The ``corral`` command line: run the gateway, manage sessions, send actions, build images."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from websockets.exceptions import ConnectionClosed, WebSocketException

from corral import commands, gateway_client, images, progress, transfer
from corral.client import Frame, SandboxClient, check_reply, image_bytes, is_reply
from corral.commands import ExecResult, OutputChunk
from corral.errors import ActionFailed, CorralError, ErrorCode, GatewayError
from corral.gateway import keystrength
from corral.gateway_client import Gateway
from corral.runtime.docker import DockerRuntime

if TYPE_CHECKING:
    from corral.proxy.audit import AuditRecord
    from corral.proxy.traffic import SecretSummary

GATEWAY_CONTAINER = "corral-gateway"
KEY_PATH = "/var/lib/corral/api_key"

app = typer.Typer(
    help="Corral: disposable desktops with Chromium for computer-use agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
images_app = typer.Typer(help="Build Corral's image.", no_args_is_help=True, pretty_exceptions_show_locals=False)
session_app = typer.Typer(
    help="Create, list, show and remove sessions.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
audit_app = typer.Typer(
    help="Check and read egress audit logs.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
app.add_typer(images_app, name="images")
app.add_typer(session_app, name="session")
app.add_typer(audit_app, name="audit")
recording_app = typer.Typer(
    help="List and download session recordings.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
app.add_typer(recording_app, name="recording")
console = Console(stderr=True)
out = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


def _runtime() -> DockerRuntime:
    try:
        return DockerRuntime()
    except CorralError as exc:
        raise _fail(str(exc)) from None


def _url() -> str:
    return gateway_client.gateway_url()


def _api_key() -> str:
    """The SDK's key (``CORRAL_API_KEY``), else the one the compose gateway keeps in its container."""
    try:
        return gateway_client.api_key(stored=lambda: _runtime().read_file(GATEWAY_CONTAINER, KEY_PATH))
    except CorralError:
        raise _fail("no API key: set CORRAL_API_KEY, or start the gateway with `corral up`") from None


def _gateway() -> Gateway:
    """The SDK's client of the gateway's HTTP API (tests swap this for one over a fake transport)."""
    return Gateway(_url(), _api_key())


@contextlib.contextmanager
def _gateway_call() -> Iterator[Gateway]:
    """The gateway for one command: a refusal or no answer is a clean failure, never a traceback."""
    try:
        with _gateway() as gateway:
            yield gateway
    except GatewayError as exc:
        raise _fail(str(exc)) from None
    except httpx.HTTPError as exc:
        raise _fail(f"no answer from the gateway on {_url()} ({exc}); start it with `corral up`") from None


def _gateway_get(path: str) -> httpx.Response:
    """GET from the gateway; a gateway that does not answer or answers an error is a clean failure."""
    with _gateway_call() as gateway:
        return gateway.get(path)


def _gateway_download(path: str, local: Path) -> None:
    """GET from the gateway streamed into ``local`` (a log is never held whole); failures as _gateway_get's."""
    with _gateway_call() as gateway:
        gateway.download(path, local)


def _gateway_rows(path: str, what: str) -> list[dict[str, Any]]:
    """A gateway listing (a JSON list of objects), or a clean failure naming what was wrong."""
    try:
        rows = _gateway_get(path).json()
    except ValueError:
        raise _fail(f"the gateway's answer to GET {path} is not JSON") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise _fail(f"the gateway's answer to GET {path} is not a list of {what}")
    return rows


def _build(runtime: DockerRuntime) -> None:
    """Build the images side by side: a status line on a terminal, plain lines (one every 10 s at
    least) in a log or a pipe, where a status line would print nothing."""
    if console.is_terminal:
        with console.status("building the images (cached layers make a rebuild take seconds)") as status:
            images.build_all(runtime, progress.Progress(console.print, status=status).task)
        return
    with progress.Progress(_plain) as shown:
        images.build_all(runtime, shown.task)


def _plain(line: str) -> None:
    """A progress line as it is (no markup, no wrapping), written at once: a log shows it when it happens."""
    print(line, file=sys.stderr, flush=True)


@images_app.command("build")
def images_build() -> None:
    """Build corral-desktop:latest and corral-egress:latest (and local Debian bases where no registry answers)."""
    runtime = _runtime()
    try:
        _build(runtime)
    except CorralError as exc:
        raise _fail(str(exc)) from None
    console.print(f"[green]built {images.DESKTOP_IMAGE} and {images.EGRESS_IMAGE}[/green]")


@app.command()
def up(build: Annotated[bool, typer.Option(help="Build the image first (seconds when cached).")] = True) -> None:
    """Build the image and start the gateway (docker compose) on 127.0.0.1:8700."""
    _refuse_a_weak_key()
    runtime = _runtime()
    try:
        if build:
            _build(runtime)
        if not console.is_terminal:
            _plain("starting the gateway")
        with console.status("starting the gateway"):
            runtime.compose(images.repo_root(), ["up", "-d", "--no-build", "gateway"])
            _wait_for_gateway(runtime)
    except CorralError as exc:
        raise _fail(str(exc)) from None
    console.print(f"[green]gateway up on {_url()}[/green]  (API key: `corral status`)")


def _refuse_a_weak_key() -> None:
    """``CORRAL_API_KEY`` (what compose hands the gateway) refused before anything starts when a key
    of it is too short or too guessable to hold; the gateway would refuse it too, less visibly."""
    keys = [key.strip() for key in os.environ.get("CORRAL_API_KEY", "").split(",") if key.strip()]
    trouble = keystrength.problem(keys)
    if trouble is not None:
        raise _fail(trouble)


def _wait_for_gateway(runtime: DockerRuntime, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{_url()}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise _fail(f"the gateway did not answer on {_url()}:\n{runtime.logs(GATEWAY_CONTAINER, 30)}")
        time.sleep(0.2)


@app.command()
def down() -> None:
    """Stop the gateway and remove its sandboxes (the data dir, with the API key and audit logs, stays)."""
    runtime = _runtime()
    try:
        runtime.compose(images.repo_root(), ["down"])
    except CorralError as exc:
        raise _fail(str(exc)) from None
    # Sandboxes, their egress proxies and their session networks (audit logs stay in the data dir).
    runtime.remove_all({"corral.gateway": os.environ.get("CORRAL_INSTANCE", "default")})
    console.print("[green]gateway stopped[/green]")


@app.command()
def status(as_json: JsonOpt = False) -> None:
    """The gateway's health, its sessions and its API key."""
    try:
        health = httpx.get(f"{_url()}/v1/health", timeout=5).json()
    except httpx.HTTPError as exc:
        raise _fail(f"no gateway on {_url()} ({exc}); start it with `corral up`") from None
    key = _api_key()
    if as_json:
        out.print_json(json.dumps({"url": _url(), "health": health, "api_key": key}))
        return
    table = Table(show_header=False)
    table.add_row("gateway", _url())
    for state, count in health["sessions"].items():
        table.add_row(f"sessions {state}", str(count))
    table.add_row("pool target", str(health["pool_target"]))
    table.add_row("API key", key)
    out.print(table)


@app.command("mcp")
def mcp_stdio() -> None:
    """Serve Corral's tools to an MCP client on stdin/stdout (docs/mcp.md), calling the gateway on
    CORRAL_URL with CORRAL_API_KEY (an API key, or a session token for that session only)."""
    try:
        from corral.mcp import serve_stdio
    except ImportError:
        raise _fail("the MCP server needs the mcp extra: pip install 'corral[mcp]'") from None
    serve_stdio(_url(), _api_key())


def _session_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("id", "state", "age", "expires in", "viewport", "allow", "labels")
    table.columns[0].no_wrap = True  # ids are copied from here
    now = time.time()
    for s in rows:
        table.add_row(
            s["id"],
            s["state"],
            f"{now - s['created_at']:.0f}s",
            f"{s['expires_at'] - now:.0f}s",
            f"{s['viewport']['width']}x{s['viewport']['height']}",
            ",".join(s["allow"]) or "-",
            ",".join(f"{k}={v}" for k, v in s["labels"].items()) or "-",
        )
    return table


@session_app.command("create")
def session_create(
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Host the session may reach (repeat).")] = None,
    viewport: Annotated[str, typer.Option(help="WIDTHxHEIGHT")] = "1280x800",
    timeout_s: Annotated[int | None, typer.Option("--timeout", help="Wall-clock limit in seconds.")] = None,
    idle_timeout_s: Annotated[int | None, typer.Option("--idle-timeout", help="Idle limit in seconds.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="KEY=VALUE (repeat).")] = None,
    egress_mode: Annotated[
        str | None, typer.Option("--egress-mode", help="enforce (default) or report (allow, log what is not allowed).")
    ] = None,
    secrets_file: Annotated[
        Path | None,
        typer.Option(
            "--secrets-file",
            help='JSON: {"NAME": {"value": ..., "allow": [...], "in": [...]}}. The sandbox gets placeholders, '
            "the proxy puts the values in (never give a value on a command line).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a session; prints its id, token and WebSocket URL (and its secrets' placeholders)."""
    width, _, height = viewport.partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise _fail("viewport must look like 1280x800", 2)
    labels = dict(item.split("=", 1) for item in (label or []) if "=" in item)
    secrets = _secrets_file(secrets_file) if secrets_file is not None else None
    body = gateway_client.session_body(
        allow, (int(width), int(height)), timeout_s, idle_timeout_s, labels, egress_mode, secrets=secrets
    )
    with _gateway_call() as gateway:
        session = gateway.create_session(body)
    created = session.wire()
    if as_json:
        out.print_json(json.dumps(created))
        return
    out.print(_session_table([created]))
    out.print(f"token: {session.token}\nws: {session.ws_url}")
    for name, placeholder in session.secrets.items():
        out.print(f"secret {name}: {placeholder}")


def _secrets_file(path: Path) -> dict[str, Any]:
    """The ``secrets`` of a create, from a JSON file; its words on failure never quote the file's content."""
    try:
        secrets = json.loads(path.read_text())
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror}", 2) from None
    except ValueError:
        raise _fail(f"{path} is not JSON", 2) from None
    if not isinstance(secrets, dict) or not all(isinstance(spec, dict) for spec in secrets.values()):
        raise _fail(f'{path} must hold an object: {{"NAME": {{"value": ..., "allow": [...]}}}}', 2)
    return secrets


@session_app.command("secrets")
def session_secrets(session_id: str, as_json: JsonOpt = False) -> None:
    """A session's secrets as its sandbox holds them: name and placeholder (values are never shown)."""
    with _gateway_call() as gateway:
        placeholders = gateway.secrets(session_id)
    if as_json:
        out.print_json(json.dumps(placeholders))
        return
    table = Table("secret", "placeholder")
    for name, placeholder in placeholders.items():
        table.add_row(name, placeholder)
    out.print(table)


@session_app.command("allow")
def session_allow(
    session_id: str,
    entries: Annotated[list[str] | None, typer.Argument(help="The new allowlist (replaces the old one).")] = None,
    egress_mode: Annotated[str | None, typer.Option("--egress-mode", help="enforce or report.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a live session's allowlist (and mode); the change is written to its audit log."""
    with _gateway_call() as gateway:
        updated = gateway.update_session(session_id, entries or [], egress_mode).wire()
    if as_json:
        out.print_json(json.dumps(updated))
        return
    out.print(_session_table([updated]))


@session_app.command("ls")
def session_ls(as_json: JsonOpt = False) -> None:
    """The sessions of this API key."""
    with _gateway_call() as gateway:
        rows = [row.wire() for row in gateway.sessions()]
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        out.print(_session_table(rows))


@session_app.command("show")
def session_show(session_id: str, as_json: JsonOpt = False) -> None:
    with _gateway_call() as gateway:
        row = gateway.session(session_id).wire()
    if as_json:
        out.print_json(json.dumps(row))
    else:
        out.print(_session_table([row]))


@session_app.command("rm")
def session_rm(session_id: str) -> None:
    with _gateway_call() as gateway:
        gateway.delete_session(session_id)
    console.print(f"removed {session_id}")


def _session_action(session_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One message through the gateway's HTTP route, the API key in its header (never in an address:
    the gateway takes ``?token=`` on a WebSocket only, and only a session token there)."""
    with _gateway_call() as gateway:
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


@app.command("do")
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
        raise _fail(f"not JSON: {exc}", 2) from None
    if not isinstance(payload, dict):
        raise _fail("the message must be a JSON object (an action, or one with 'action'/'anthropic'/'openai')", 2)
    if not ({"action", "anthropic", "openai"} & payload.keys()):
        payload = {"action": payload}
    if output is not None and "screenshot" not in payload and "action" in payload:
        payload["screenshot"] = True
    reply = _session_action(session_id, payload)
    typer.echo(json.dumps(_strip_images(reply, output), ensure_ascii=False))
    if not reply.get("ok"):
        raise typer.Exit(1)


@app.command()
def screenshot(
    session_id: str,
    output: Annotated[Path, typer.Option("-o", "--output")] = Path("shot.png"),
    fmt: Annotated[str, typer.Option("--format")] = "png",
) -> None:
    """Save a screenshot of a session."""
    reply = _session_action(session_id, {"action": {"type": "screenshot", "format": fmt}})
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise _fail(f"{error.get('code')}: {error.get('message')}")
    output.write_bytes(image_bytes(reply))
    console.print(f"saved {output}")


def _sandbox_client(session_id: str) -> SandboxClient:
    """The session's WebSocket through the gateway, the API key in its handshake's header (tests swap this)."""
    base = _url().rstrip("/")
    ws_base = "ws" + base[4:] if base.startswith("http") else base
    quoted = urllib.parse.quote(session_id, safe="")
    return SandboxClient(f"{ws_base}/v1/sessions/{quoted}/ws", headers={"Authorization": f"Bearer {_api_key()}"})


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _fail(f"--env takes NAME=VALUE, not {item!r}", 2)
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
    raise _fail("the connection ended before the command's result")


def _write_stream(name: str, data: bytes) -> None:
    target = sys.stderr if name == "stderr" else sys.stdout
    target.flush()
    target.buffer.write(data)
    target.buffer.flush()


# Exit codes for commands that could not start, as a shell gives them.
_START_FAILURES: dict[str, int] = {ErrorCode.PROGRAM_NOT_FOUND: 127, ErrorCode.PERMISSION_DENIED: 126}


@app.command("exec")
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
        raise _fail("give a command after -- (argv), or --sh 'a shell string', not both", 2)
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
        with _sandbox_client(session_id) as client:
            result = _print_output(client.stream({"action": action}))
    except ActionFailed as exc:
        raise _fail(str(exc), _START_FAILURES.get(exc.code, 1)) from None
    except ConnectionClosed as exc:  # the gateway refused the session (4401/4403/4404), or it ended
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        raise _fail(f"the session's connection closed: {reason or exc}") from None
    except (OSError, CorralError, WebSocketException) as exc:
        raise _fail(f"cannot run the command: {exc}") from None
    if result.timed_out:
        console.print(f"[red]timed out after {timeout} s; the command and its children were killed[/red]")
    raise typer.Exit(result.exit_status())


@app.command("cp")
def cp(
    source: Annotated[str, typer.Argument(help="A local path, or ID:/path in a session.")],
    destination: Annotated[str, typer.Argument(help="ID:/path in a session, or a local path.")],
    parents: Annotated[bool, typer.Option("--parents", "-p", help="Make missing directories in the session.")] = False,
) -> None:
    """Copy a file or a directory into a session or out of it (streamed through the gateway).

    `corral cp ./src ID:/workspace/src` uploads file by file; `corral cp ID:/workspace/out ./out`
    downloads a directory as a tar and unpacks it, letting nothing out of ./out."""
    remote_from, remote_to = transfer.Remote.parse(source), transfer.Remote.parse(destination)
    if (remote_from is None) == (remote_to is None):
        raise _fail("one side is ID:/path in a session, the other a local path", 2)
    with _gateway_call() as gateway:
        try:
            if remote_to is not None:
                _upload(gateway, Path(source), remote_to, parents)
            else:
                assert remote_from is not None
                _download(gateway, remote_from, Path(destination))
        except (OSError, CorralError) as exc:
            if isinstance(exc, GatewayError):
                raise
            raise _fail(f"cannot copy: {exc}") from None


def _upload(gateway: Gateway, local: Path, remote: transfer.Remote, parents: bool) -> None:
    if not local.exists():
        raise _fail(f"no such file: {local}", 2)
    into = remote.path
    if transfer.may_be_directory(local, into) and _remote_is_directory(remote.session_id, into):
        into += "/"  # `cp f ID:/workspace` puts f inside the directory, as cp does
    target = transfer.remote_target(local, into)
    plan = transfer.upload_plan(local, target)
    size = 0
    for path, into in plan:
        written = gateway.upload_file(remote.session_id, into, path, make_dirs=parents or local.is_dir())
        size += written.size
    console.print(f"uploaded {len(plan)} file{'s' * (len(plan) != 1)} ({size} bytes) to {remote.session_id}:{target}")


def _left_out(names: list[str]) -> None:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    console.print(f"left out {len(names)} symbolic link(s), device(s) or fifo(s): {shown}")


def _remote_is_directory(session_id: str, path: str) -> bool:
    """Whether ``path`` in the session is a directory (``file_stat`` over its WebSocket); False when
    nothing is there yet."""
    with _sandbox_client(session_id) as client:
        try:
            found = client.act({"type": "file_stat", "path": path})
        except ActionFailed as exc:
            if exc.code == "no_such_file":
                return False
            raise
    return bool(found["result"].get("type") == "directory")


def _download(gateway: Gateway, remote: transfer.Remote, local: Path) -> None:
    target = transfer.local_target(remote.path, local)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.corral-cp")
    try:
        got = gateway.download_file(remote.session_id, remote.path, part)
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:  # the gateway answered, then stopped
        raise CorralError(f"the download was cut short ({exc}); nothing was written") from None
    transfer.settle(got, target, _left_out)
    what = "directory" if got.is_tar else "file"
    console.print(f"downloaded {what} {remote.session_id}:{remote.path} to {target} ({got.size} bytes)")


@audit_app.command("verify")
def audit_verify(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    anchors: Annotated[
        Path | None,
        typer.Option(
            help="The gateway's anchors of this log (from GET /v1/sessions/ID/traffic.anchors, or "
            "<data_dir>/audit-anchors/ID.jsonl); fetched from the gateway when SOURCE is a session id."
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(help="The gateway's anchor key (<data_dir>/audit-anchors/key): check each anchor's MAC."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Prove an audit log untouched, or name the first record that was changed, removed or moved.

    With the gateway's anchors it also catches a log cut short or rewritten as a whole; without
    them it proves internal consistency only.
    """
    import tempfile

    from corral.proxy.audit import parse_anchors, verify_anchored

    path = Path(source)
    with tempfile.TemporaryDirectory() as scratch:
        anchor_lines: list[bytes] | None = None
        if source.startswith("ses_") and not path.exists():
            quoted = urllib.parse.quote(source, safe="")
            path = Path(scratch) / "audit.jsonl"
            _gateway_download(f"/v1/sessions/{quoted}/traffic", path)
            if anchors is None:
                # Served only after the gateway checked every anchor's MAC with its key.
                anchor_lines = _gateway_get(f"/v1/sessions/{quoted}/traffic.anchors").content.splitlines()
        if not path.is_file():
            raise _fail(f"no audit log at {path}", 2)
        try:
            if anchors is not None:
                anchor_lines = anchors.read_bytes().splitlines()
            secret = key.read_bytes() if key is not None else None
        except OSError as exc:
            raise _fail(f"cannot read {exc.filename}: {exc.strerror or exc}", 2) from None
        try:
            found = parse_anchors(anchor_lines or [], secret)
        except ValueError as exc:
            raise _fail(f"the anchors are not the gateway's: {exc}") from None
        try:
            result = verify_anchored(path, found)
        except ValueError as exc:
            raise _fail(str(exc), 2) from None
    if as_json:
        out.print_json(json.dumps({**result.to_dict(), "mac_checked": secret is not None}))
    else:
        style = {"intact": "green", "unanchored": "yellow"}.get(result.status, "red")
        label = "ok" if result.status == "intact" else result.status
        out.print(Text.assemble((label, style), ": ", result.message))
        if found and secret is None and anchors is not None:
            out.print(Text("the anchors' MACs were not checked: give --key to prove they are the gateway's"))
    if not result.ok:
        raise typer.Exit(1)


def _when(seconds: Any) -> str:
    """A unix time as UTC text, as `audit show --since/--until` accept it back."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    try:
        return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def _cell(value: Any) -> Text:
    """Log content as plain text: a URL or reason with [brackets] is not rich markup."""
    return Text("-" if value is None or value == "" else str(value))


_DECISION_STYLE = {"allow": "green", "deny": "red", "report": "yellow"}


@contextlib.contextmanager
def _audit_log_file(source: str) -> Iterator[tuple[Path, str]]:
    """A local audit log and how to name it: the file given, or a session's log streamed from the
    gateway into a scratch file."""
    import tempfile

    path = Path(source)
    if source.startswith("ses_") and not path.exists():
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "audit.jsonl"
            _gateway_download(f"/v1/sessions/{urllib.parse.quote(source, safe='')}/traffic", local)
            yield local, f"session {source}"
        return
    if not path.is_file():
        raise _fail(f"no audit log at {path} (give a .jsonl file or a session id, ses_...)", 2)
    yield path, str(path)


def _audit_records(log: tuple[Path, str]) -> Iterator[AuditRecord]:
    """The records of a local audit log, read lazily, one bounded line at a time; an unreadable one
    is a clean failure."""
    from corral.proxy.audit import bounded_lines
    from corral.proxy.traffic import parse_records

    path, name = log
    try:
        with path.open("rb") as lines:
            yield from parse_records(bounded_lines(lines), source=name)
    except ValueError as exc:
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        raise _fail(f"not an audit log: {message}") from None
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}") from None


def _names(value: Any) -> str:
    return ", ".join(str(name) for name in value) if isinstance(value, list) and value else ""


def _secrets_change(record: AuditRecord) -> str:
    """A ``secrets`` record in words: who changed what (names only; a record never holds a value)."""
    parts = [
        f"{what} {names}"
        for what, names in (
            ("added", _names(record.get("added"))),
            ("rotated", _names(record.get("rotated"))),
            ("revoked", _names(record.get("revoked"))),
            ("restored", _names(record.get("restored"))),
        )
        if names
    ]
    bindings = record.get("bindings")
    live = _names(sorted(bindings)) if isinstance(bindings, dict) else ""
    return f"by {record.get('actor') or '?'}: {'; '.join(parts) or 'no change'}; live: {live or 'none'}"


def _secret_use(record: AuditRecord) -> str:
    """Which secret, where, how many times; and for a block whether it was flagged as exfiltration."""
    count = record.get("count")
    times = f" x{count}" if isinstance(count, int) and not isinstance(count, bool) else ""
    flagged = " (exfiltration)" if record.get("exfiltration") is True else ""
    return f"{record.get('secret') or '?'} in {record.get('location') or '?'}{times}{flagged}"


def _acted(record: AuditRecord) -> str | None:
    """The action a record is charged to, and who acted in it when not the agent (a human, CDP)."""
    action, actor = record.get("action"), record.get("actor")
    if actor is None or record.get("event") in ("policy", "secrets", "link"):  # there: who made a change
        return action
    return f"{action} ({actor})"


def _detail(record: AuditRecord) -> str:
    event = record.get("event")
    if event == "secrets":
        return _secrets_change(record)
    if event == "secret" or (event == "block" and record.get("secret") is not None):
        rule, reason = record.get("rule"), record.get("reason")
        return " — ".join(str(part) for part in (rule, _secret_use(record), reason) if part)
    if event == "error":
        return str(record.get("error") or "")
    if event == "proxy":
        return f"version {record.get('version')}, mode {record.get('mode')}"
    if event == "policy":
        allow = record.get("allow")
        allowed = ", ".join(str(a) for a in allow) if isinstance(allow, list) else ""
        return f"by {record.get('actor') or '?'}: mode {record.get('mode')}, allow {allowed or 'nothing'}"
    if event == "link":
        return f"{record.get('mode')} link {record.get('link')} {record.get('change')} (made by {record.get('actor')})"
    if event == "control":
        return f"lease {record.get('change')}: {record.get('previous')} -> {record.get('holder')}"
    rule, reason = record.get("rule"), record.get("reason")
    return " — ".join(str(part) for part in (rule, reason) if part)


@audit_app.command("show")
def audit_show(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    host: Annotated[str | None, typer.Option(help="Only this host; *.example.com for its subdomains.")] = None,
    decision: Annotated[str | None, typer.Option(help="Only allow, deny or report.")] = None,
    event: Annotated[
        str | None,
        typer.Option(help="Only proxy, connect, request, block, error, policy, secrets or secret records."),
    ] = None,
    action: Annotated[str | None, typer.Option(help="Only records of this agent action id.")] = None,
    since: Annotated[
        str | None, typer.Option(help="From this time: unix seconds or ISO 8601 (UTC if no zone).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Up to this time: unix seconds or ISO 8601 (UTC if no zone).")
    ] = None,
    secrets: Annotated[
        bool,
        typer.Option(
            "--secrets", help="Only brokered secrets' records: changes, uses, and requests refused because of one."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON Lines for scripts.")] = False,
) -> None:
    """The records of an audit log, filtered: what the session's browser reached, and what was refused."""
    from corral.proxy.traffic import TrafficFilter

    try:
        flt = TrafficFilter.parse(
            host=host, decision=decision, event=event, action=action, since=since, until=until, secrets=secrets
        )
    except ValueError as exc:
        raise _fail(f"bad filter: {exc}", 2) from None
    with _audit_log_file(source) as log:
        if as_json:
            for record in _audit_records(log):
                if flt.matches(record):
                    # As the log stores them, so a whole unfiltered dump still passes `corral audit verify`.
                    typer.echo(json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            return
        seen = 0
        shown: list[AuditRecord] = []
        for record in _audit_records(log):
            seen += 1
            if flt.matches(record):
                shown.append(record)
    table = Table(
        "seq",
        "time",
        "event",
        "decision",
        "method",
        "host",
        "status",
        "action",
        "rule / reason",
        caption=f"{len(shown)} of {seen} records",
    )
    for record in shown:
        decision_text = record.get("decision")
        status = record.get("status")
        table.add_row(
            _cell(record.get("seq")),
            _when(record.get("time")),
            _cell(record.get("event")),
            Text(str(decision_text or "-"), style=_DECISION_STYLE.get(str(decision_text), "")),
            _cell(record.get("method")),
            _cell(record.get("host")),
            _cell(status if record.get("event") in ("request", "block") else None),
            _cell(_acted(record)),
            _cell(_detail(record)),
        )
    out.print(table)


@audit_app.command("summary")
def audit_summary(
    source: Annotated[str, typer.Argument(help="An audit log (.jsonl file) or a session id (ses_...).")],
    as_json: JsonOpt = False,
) -> None:
    """Per host: requests let through, blocked, reported (would be denied), errors and bytes; and per
    host and brokered secret: substitutions, reflections scrubbed, misuse and unavailable refusals."""
    from dataclasses import asdict

    from corral.proxy.traffic import summarize, summarize_secrets, totals

    with _audit_log_file(source) as log:
        rows = summarize(_audit_records(log))
        secret_rows = summarize_secrets(_audit_records(log))
    total = totals(rows)
    if as_json:
        answer: dict[str, Any] = {"hosts": [asdict(row) for row in rows], "total": asdict(total)}
        if secret_rows:  # only in logs of sessions that used secrets
            answer["secrets"] = [asdict(row) for row in secret_rows]
        out.print_json(json.dumps(answer))
        return
    table = Table("host", "requests", "blocked", "reported", "errors", "bytes in", "bytes out")
    for column in table.columns[1:]:
        column.justify = "right"
    for row in [*rows, total]:
        if row is total:
            table.add_section()
        table.add_row(
            Text(row.host, style="bold" if row is total else ""),
            *(
                f"{value:,}"
                for value in (row.requests, row.blocked, row.reported, row.errors, row.bytes_in, row.bytes_out)
            ),
            style="bold" if row is total else None,
        )
    out.print(table)
    if secret_rows:
        out.print(_secrets_table(secret_rows))


def _secrets_table(rows: list[SecretSummary]) -> Table:
    table = Table(
        "host",
        "secret",
        "substitutions",
        "reflections scrubbed",
        "misuse blocks",
        "exfiltration",
        "unavailable",
        title="brokered secrets",
    )
    for column in table.columns[2:]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            Text(row.host),
            Text(row.secret or "-"),
            *(
                f"{value:,}"
                for value in (row.substitutions, row.reflections, row.misuse, row.exfiltration, row.unavailable)
            ),
        )
    return table


@audit_app.command("ls")
def audit_ls(as_json: JsonOpt = False) -> None:
    """The audit logs the gateway keeps, of live and ended sessions."""
    rows = _gateway_rows("/v1/audit", "audit logs")
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("session", "state", "created", "ended", "records", "bytes")
    table.columns[0].no_wrap = True  # ids are copied from here
    for column in table.columns[4:]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            _cell(row.get("session")),
            _cell(row.get("state")),
            _when(row.get("created_at")),
            _when(row.get("ended_at")),
            _cell(row.get("records")),
            _cell(row.get("bytes")),
        )
    out.print(table)


def main() -> None:
    app()


@recording_app.command("ls")
def recording_ls(as_json: JsonOpt = False) -> None:
    """The recordings the gateway keeps, of live and ended sessions."""
    rows = _gateway_rows("/v1/recordings", "recordings")
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("session", "state", "created", "ended", "events", "bytes", "cut")
    table.columns[0].no_wrap = True
    for column in table.columns[4:6]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            _cell(row.get("session")),
            _cell(row.get("state")),
            _when(row.get("created_at")),
            _when(row.get("ended_at")),
            _cell(row.get("events")),
            _cell(row.get("bytes")),
            _cell(row.get("cut")),  # why it stopped storing (its byte budget), if it did
        )
    out.print(table)


@recording_app.command("get")
def recording_get(
    session_id: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Where to write the .zip.")] = None,
) -> None:
    """Download a session's recording bundle (a .zip; format in docs/recording.md) and check it reads."""
    from corral.recording.bundle import BundleError, read_bundle

    target = output or Path(f"{session_id}.zip")
    response = _gateway_get(f"/v1/sessions/{session_id}/recording")
    target.write_bytes(response.content)
    try:
        bundle = read_bundle(target)
    except BundleError as exc:
        raise _fail(f"downloaded, but it does not read: {exc}") from None
    console.print(
        f"[green]{target}[/green]: {len(bundle.actions)} actions, {len(bundle.frames)} frames"
        + (" (cut short: last line dropped)" if bundle.truncated else "")
    )


@app.command()
def replay(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A recording: a .zip or its directory.")],
    against: Annotated[str | None, typer.Option("--against", help="Gateway URL (default $CORRAL_URL).")] = None,
    threshold: Annotated[float, typer.Option(help="Share of pixels allowed to differ per step.")] = 0.01,
    mask: Annotated[list[str] | None, typer.Option("--mask", help="x,y,width,height to ignore (repeat).")] = None,
    overrides: Annotated[Path | None, typer.Option(help="JSON: per-step threshold, masks, skip, expect.")] = None,
    expect: Annotated[
        list[str] | None,
        typer.Option("--expect", help="stdout=exact or stderr=exact: compare that output of every exec step."),
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the HTML report here.")] = None,
    timing: Annotated[str, typer.Option(help="settle (as fast as the sandbox settles) or recorded.")] = "settle",
    hermetic: Annotated[
        bool, typer.Option(help="The proxy answers only from the recorded responses; no live site is reached.")
    ] = False,
) -> None:
    """Re-run a recorded session in a fresh sandbox and compare each step's screen; exit 1 on a divergence."""
    from corral.recording.bundle import BundleError, read_bundle
    from corral.recording.replay import Mask, ReplayOptions, html_report, junit_xml, parse_expect, parse_overrides
    from corral.recording.replay import replay as run_replay
    from corral.sdk import Sandbox

    if timing not in ("settle", "recorded"):
        raise _fail("--timing is settle or recorded", 2)
    if not 0 <= threshold <= 1:
        raise _fail("--threshold is a share between 0 and 1", 2)
    try:
        bundle = read_bundle(bundle_path)
        options = ReplayOptions(
            threshold=threshold,
            masks=tuple(Mask.parse(m) for m in mask or []),
            overrides=parse_overrides(overrides.read_text()) if overrides is not None else {},
            recorded_timing=timing == "recorded",
            expect=parse_expect(dict(item.partition("=")[::2] for item in expect or []), "--expect"),
        )
    except (BundleError, ValueError, OSError) as exc:
        raise _fail(str(exc), 2) from None
    if hermetic and bundle.responses is None:
        raise _fail(
            f"{bundle_path} holds no recorded responses (responses.mitm): it was recorded without egress "
            "control or with CORRAL_RECORD_RESPONSES off; replay it without --hermetic",
            2,
        )
    manifest = bundle.manifest
    viewport = (int(manifest["viewport"]["width"]), int(manifest["viewport"]["height"]))
    try:
        with Sandbox.create(
            allow=list(manifest.get("allow") or []),
            viewport=viewport,
            egress_mode=manifest.get("egress_mode"),
            url=gateway_client.gateway_url(against),
            api_key=_api_key(),
            hermetic_responses=bundle.responses if hermetic else None,
        ) as sandbox:
            result = run_replay(bundle, sandbox.request, options, console.print)
    except (GatewayError, httpx.HTTPError) as exc:
        raise _fail(f"cannot replay: {exc}") from None
    except Exception as exc:  # a frame that is no image, a session reaped mid-replay: one line, no traceback
        raise _fail(f"replay stopped: {type(exc).__name__}: {exc}") from None
    if junit is not None:
        junit.write_bytes(junit_xml(result))
    if report is not None:
        report.write_text(html_report(result))
    failed = result.divergences
    if failed:
        console.print(
            f"[red]{len(failed)} of {len(result.steps)} steps diverged:[/red] "
            + ", ".join(str(step.number) for step in failed)
        )
        raise typer.Exit(1)
    skipped = f" ({len(result.skipped)} skipped, each saying why)" if result.skipped else ""
    console.print(f"[green]all {len(result.steps) - len(result.skipped)} compared steps matched[/green]{skipped}")


export_app = typer.Typer(help="Export recordings.", no_args_is_help=True, pretty_exceptions_show_locals=False)
app.add_typer(export_app, name="export")


@export_app.command("video")
def export_video(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A recording: a .zip or its directory.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="session.mp4 or session.webm")] = Path("session.mp4"),
) -> None:
    """The recording's frames as a video at the recorded timing (MP4 or WebM)."""
    from corral.recording.bundle import BundleError, read_bundle
    from corral.recording.video import export

    try:
        seconds = export(read_bundle(bundle_path), output)
    except (BundleError, ValueError) as exc:
        raise _fail(str(exc), 2) from None
    except Exception as exc:  # ffmpeg failing, a frame that is no image, an unwritable target
        raise _fail(f"no video: {type(exc).__name__}: {exc}") from None
    console.print(f"[green]{output}[/green]: {seconds:.1f} s")


if __name__ == "__main__":
    main()
