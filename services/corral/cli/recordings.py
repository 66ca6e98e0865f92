"""``corral recording ...``, ``replay`` and ``export video``: a session's recording downloaded,
re-run against a gateway, turned into a video. ``replay`` needs the ``replay`` extra (Pillow, the
key names' X keysyms), ``export video`` the ``video`` extra (ffmpeg, Pillow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.table import Table

from corral import gateway_client
from corral.cli import common
from corral.errors import GatewayError

if TYPE_CHECKING:
    from corral.recording.bundle import Bundle
    from corral.recording.replay import ReplayOptions, ReplayReport

recording_app = typer.Typer(
    help="List and download session recordings.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
export_app = typer.Typer(help="Export recordings.", no_args_is_help=True, pretty_exceptions_show_locals=False)


@recording_app.command("ls")
def recording_ls(as_json: common.JsonOpt = False) -> None:
    """The recordings the gateway keeps, of live and ended sessions."""
    rows = common.gateway_rows("/v1/recordings", "recordings")
    if as_json:
        common.out.print_json(json.dumps(rows))
        return
    table = Table("session", "state", "created", "ended", "events", "bytes", "cut")
    table.columns[0].no_wrap = True
    for column in table.columns[4:6]:
        column.justify = "right"
    for row in rows:
        table.add_row(
            common.cell(row.get("session")),
            common.cell(row.get("state")),
            common.when(row.get("created_at")),
            common.when(row.get("ended_at")),
            common.cell(row.get("events")),
            common.cell(row.get("bytes")),
            common.cell(row.get("cut")),  # why it stopped storing (its byte budget), if it did
        )
    common.out.print(table)


@recording_app.command("get")
def recording_get(
    session_id: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Where to write the .zip.")] = None,
) -> None:
    """Download a session's recording bundle (a .zip; format in docs/recording.md) and check it reads."""
    from corral.recording.bundle import BundleError, read_bundle

    target = output or Path(f"{session_id}.zip")
    response = common.gateway_get(f"/v1/sessions/{session_id}/recording")
    target.write_bytes(response.content)
    try:
        bundle = read_bundle(target)
    except BundleError as exc:
        raise common.fail(f"downloaded, but it does not read: {exc}") from None
    common.console.print(
        f"[green]{target}[/green]: {len(bundle.actions)} actions, {len(bundle.frames)} frames"
        + (" (cut short: last line dropped)" if bundle.truncated else "")
    )


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

    with common.needed("replay", "replay"):
        from corral.recording import replay as replaying
    if timing not in ("settle", "recorded"):
        raise common.fail("--timing is settle or recorded", 2)
    if not 0 <= threshold <= 1:
        raise common.fail("--threshold is a share between 0 and 1", 2)
    try:
        bundle = read_bundle(bundle_path)
        options = replaying.ReplayOptions(
            threshold=threshold,
            masks=tuple(replaying.Mask.parse(m) for m in mask or []),
            overrides=replaying.parse_overrides(overrides.read_text()) if overrides is not None else {},
            recorded_timing=timing == "recorded",
            expect=replaying.parse_expect(dict(item.partition("=")[::2] for item in expect or []), "--expect"),
        )
    except (BundleError, ValueError, OSError) as exc:
        raise common.fail(str(exc), 2) from None
    if hermetic and bundle.responses is None:
        raise common.fail(
            f"{bundle_path} holds no recorded responses (responses.mitm): it was recorded without egress "
            "control or with CORRAL_RECORD_RESPONSES off; replay it without --hermetic",
            2,
        )
    result = _replayed(bundle, options, gateway_client.gateway_url(against), hermetic)
    _report(result, junit, report)


def _replayed(bundle: Bundle, options: ReplayOptions, url: str, hermetic: bool) -> ReplayReport:
    """The bundle replayed in a fresh sandbox of the gateway at ``url``, made as the recorded one was."""
    from corral.recording.replay import replay as run_replay
    from corral.sdk import Sandbox

    manifest = bundle.manifest
    viewport = (int(manifest["viewport"]["width"]), int(manifest["viewport"]["height"]))
    try:
        with Sandbox.create(
            allow=list(manifest.get("allow") or []),
            viewport=viewport,
            egress_mode=manifest.get("egress_mode"),
            url=url,
            api_key=common.api_key(),
            hermetic_responses=bundle.responses if hermetic else None,
        ) as sandbox:
            return run_replay(bundle, sandbox.request, options, common.console.print)
    except (GatewayError, httpx.HTTPError) as exc:
        raise common.fail(f"cannot replay: {exc}") from None
    except Exception as exc:  # a frame that is no image, a session reaped mid-replay: one line, no traceback
        raise common.fail(f"replay stopped: {type(exc).__name__}: {exc}") from None


def _report(result: ReplayReport, junit: Path | None, report: Path | None) -> None:
    """The reports asked for, then the verdict: the diverged steps (exit 1), or all matched."""
    from corral.recording.replay import html_report, junit_xml

    if junit is not None:
        junit.write_bytes(junit_xml(result))
    if report is not None:
        report.write_text(html_report(result))
    failed = result.divergences
    if failed:
        common.console.print(
            f"[red]{len(failed)} of {len(result.steps)} steps diverged:[/red] "
            + ", ".join(str(step.number) for step in failed)
        )
        raise typer.Exit(1)
    skipped = f" ({len(result.skipped)} skipped, each saying why)" if result.skipped else ""
    compared = len(result.steps) - len(result.skipped)
    common.console.print(f"[green]all {compared} compared steps matched[/green]{skipped}")


@export_app.command("video")
def export_video(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A recording: a .zip or its directory.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="session.mp4 or session.webm")] = Path("session.mp4"),
) -> None:
    """The recording's frames as a video at the recorded timing (MP4 or WebM)."""
    from corral.recording.bundle import BundleError, read_bundle

    with common.needed("video", "export video"):
        from corral.recording.video import export

        try:
            seconds = export(read_bundle(bundle_path), output)
        except (BundleError, ValueError) as exc:
            raise common.fail(str(exc), 2) from None
        except ModuleNotFoundError:
            raise  # ffmpeg's wheel is imported when it is needed: the video extra, named by common.needed
        except Exception as exc:  # ffmpeg failing, a frame that is no image, an unwritable target
            raise common.fail(f"no video: {type(exc).__name__}: {exc}") from None
    common.console.print(f"[green]{output}[/green]: {seconds:.1f} s")
