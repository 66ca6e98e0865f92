"""The gateway's recorder against a controller answering through httpx's MockTransport (the seam):
boot ids keep events unduplicated across controller and gateway restarts; bundles close on every
path; the zip holds the recorded responses up to the last whole flow."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.contracts import auth
from corral.errors import UnprovenController
from corral.gateway.recording import RecordingManager, SessionRecorder

from .controller_fake import SECRET, proving

FLOW = b"25:2:id;3:abc;4:type;4:http;}"


class Controller:
    """Serves /v1/recording like a sandbox's controller: events numbered per boot."""

    def __init__(self, boot: str) -> None:
        self.boot = boot
        self.events: list[dict[str, Any]] = []

    def act(self, count: int) -> None:
        for _ in range(count):
            self.events.append({"seq": len(self.events) + 1, "request": {"id": "x"}, "ok": True})

    def restart(self, boot: str) -> None:
        self.boot, self.events = boot, []

    def handler(self, request: httpx.Request) -> httpx.Response:
        after = int(request.url.params.get("after", 0))
        events = [e for e in self.events if e["seq"] > after]
        body = {"events": events, "oldest": 1, "last": len(self.events), "boot": self.boot}
        return httpx.Response(200, json=body)


def _events(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "events.jsonl").read_text().splitlines()]


async def _recorder(directory: Path, controller: Controller) -> SessionRecorder:
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller.handler)))
    recorder = SessionRecorder(directory, "http://sandbox", None, client, SECRET)
    recorder.start({"session": directory.name, "viewport": {"width": 1, "height": 1}}, "key-a")
    assert recorder.stop_polling() is not None  # the test drives the fetches itself
    return recorder


async def test_a_controller_restart_then_a_gateway_restart_duplicates_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "ses_0123456789abcdef"
    controller = Controller("boot-1")
    controller.act(3)
    first = await _recorder(directory, controller)
    await first.fetch(0)
    controller.restart("boot-2")  # the controller restarts and catches up with the old count
    controller.act(4)
    await first.fetch(0)
    await first.fetch(0)
    # The gateway restarts: a new recorder carries on from the bundle on disk.
    second = await _recorder(directory, controller)
    await second.fetch(0)
    controller.act(1)
    await second.fetch(0)
    kinds = [(e["event"], e.get("controller_boot"), e.get("controller_seq")) for e in _events(directory)]
    assert kinds == [
        ("action", "boot-1", 1),
        ("action", "boot-1", 2),
        ("action", "boot-1", 3),
        ("controller_restarted", "boot-2", None),
        ("action", "boot-2", 1),
        ("action", "boot-2", 2),
        ("action", "boot-2", 3),
        ("action", "boot-2", 4),
        ("action", "boot-2", 5),
    ]
    assert [e["seq"] for e in _events(directory)] == list(range(1, 10))


async def test_stopping_closes_the_manifest_even_when_the_controller_is_gone(tmp_path: Path) -> None:
    directory = tmp_path / "ses_0123456789abcdef"

    def gone(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route")

    client = httpx.AsyncClient(transport=httpx.MockTransport(gone))
    recorder = SessionRecorder(directory, "http://sandbox", None, client)
    recorder.start({"session": directory.name}, "key-a")
    await recorder.stop("deleted", drain_s=0.5)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["end_reason"] == "deleted" and manifest["ended_at"]


async def test_stopping_ends_the_controllers_cdp_connections_before_its_last_read(tmp_path: Path) -> None:
    # A CDP connection's end is recorded once its relay ended, which the gateway's door closing only
    # starts: the controller ends them all (and answers once they did) before the last read.
    directory = tmp_path / "ses_0123456789abcdef"
    controller, asked = Controller("boot-1"), []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path, dict(request.url.params)))
        if request.url.path == "/v1/cdp/close":
            controller.events.append({"seq": len(controller.events) + 1, "event": "cdp", "change": "disconnected"})
            return httpx.Response(200, json={"ok": True})
        return controller.handler(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(handler)))
    recorder = SessionRecorder(directory, "http://sandbox", None, client, SECRET)
    recorder.start({"session": directory.name}, "key-a")
    assert recorder.stop_polling() is not None
    await recorder.stop("deleted", drain_s=2.0)
    assert asked[0] == ("POST", "/v1/cdp/close", {"wait_ms": "1000"})
    assert [path for _, path, _ in asked[1:]] == ["/v1/recording"]
    assert [e.get("change") for e in _events(directory)] == ["disconnected"]


async def test_the_zip_stores_frames_and_holds_whole_flows_of_the_live_responses(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path / "recordings")
    responses = tmp_path / "responses.mitm"
    responses.write_bytes(FLOW + FLOW[:10])  # the proxy is writing the second flow
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(Controller("b").handler)))
    manager.start(
        "ses_0123456789abcdef", "http://sandbox", None, client, {"viewport": {}}, "key-a", responses, secret=SECRET
    )
    frames = manager.directory("ses_0123456789abcdef") / "frames"
    (frames / "000001.webp").write_bytes(b"RIFF....WEBP" + b"\0" * 100)
    out = io.BytesIO()
    manager.zip("ses_0123456789abcdef", out)
    with zipfile.ZipFile(out) as archive:
        info = {i.filename: i for i in archive.infolist()}
        assert archive.read("ses_0123456789abcdef/responses.mitm") == FLOW
    assert info["ses_0123456789abcdef/frames/000001.webp"].compress_type == zipfile.ZIP_STORED
    assert info["ses_0123456789abcdef/manifest.json"].compress_type == zipfile.ZIP_DEFLATED
    assert "ses_0123456789abcdef/.owner" not in info
    await manager.stop("ses_0123456789abcdef", "deleted", drain_s=0.1)
    responses.write_bytes(FLOW * 2)
    ended = io.BytesIO()
    manager.zip("ses_0123456789abcdef", ended)  # ended, its proxy not yet gone: the file is still in
    with zipfile.ZipFile(ended) as archive:
        assert archive.read("ses_0123456789abcdef/responses.mitm") == FLOW * 2
    manager.attach_responses("ses_0123456789abcdef", responses)
    assert (manager.directory("ses_0123456789abcdef") / "responses.mitm").read_bytes() == FLOW * 2
    assert not responses.exists()  # moved: one copy, in the bundle


def test_a_session_lost_while_the_gateway_was_down_gets_its_bundle_closed(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path / "recordings")
    directory = manager.directory("ses_0123456789abcdef")
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"format": "corral-recording", "version": 1}))
    (directory / "events.jsonl").write_text('{"seq": 1, "event": "action"}\n')
    manager.close_ended("ses_0123456789abcdef", "lost", None)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert (manifest["end_reason"], manifest["events"]) == ("lost", 1) and manifest["ended_at"]
    with pytest.raises(FileNotFoundError):
        manager.zip("ses_fedcba9876543210", io.BytesIO())


async def test_an_impostor_on_the_controllers_port_records_nothing(tmp_path: Path) -> None:
    """Whatever holds the port without the per-boot secret (a process of the agent's uid after a
    crash) cannot prove it: its events are never written."""
    directory = tmp_path / "ses_0123456789abcdef"
    impostor = Controller("forged")
    impostor.act(3)
    # It answers with a proof, but of a secret of its own.
    client = httpx.AsyncClient(transport=httpx.MockTransport(proving(impostor.handler, auth.new_secret())))
    recorder = SessionRecorder(directory, "http://sandbox", None, client, SECRET)
    recorder.start({"session": directory.name}, "key-a")
    assert recorder.stop_polling() is not None
    with pytest.raises(UnprovenController):
        await recorder.fetch(0)
    assert not (directory / "events.jsonl").exists() or _events(directory) == []
    await recorder.stop("deleted", drain_s=0.1)


async def test_a_controller_that_kept_uploaded_bytes_and_whole_outputs_is_redacted_here(tmp_path: Path) -> None:
    # An older (or hostile) controller sends the bytes whole: the gateway cuts them before writing.
    from corral.recording.bundle import read_bundle
    from corral.recording.redact import INPUT_PREFIX_BYTES

    directory = tmp_path / "ses_0123456789abcdee"
    controller = Controller("boot-1")
    upload, output = "U" * 200_000, "O" * 300_000
    write = {"type": "file_write", "path": "/workspace/big", "content": upload}
    run = {"type": "exec", "command": "cat /workspace/big", "cwd": "/workspace"}
    controller.events += [
        {
            "seq": 1,
            "request": {"id": 1, "action": write},
            "native": [write],
            "ok": True,
            "reply": {"ok": True, "id": 1, "result": {"path": "/workspace/big", "size": 200_000, "sha256": "ab"}},
        },
        {
            "seq": 2,
            "request": {"id": 2, "action": run},
            "native": [run],
            "ok": True,
            "reply": {
                "ok": True,
                "id": 2,
                "result": {"exit_code": 0, "stdout": output, "stderr": "", "duration_ms": 3},
            },
        },
    ]
    recorder = await _recorder(directory, controller)
    await recorder.fetch(0)
    text = (directory / "events.jsonl").read_text()
    assert upload[: INPUT_PREFIX_BYTES + 1] not in text and output[:100_000] not in text
    written, ran = read_bundle(directory).actions
    assert written["payloads"]["request.action.content"]["size"] == 200_000
    assert written["reply"]["result"]["sha256"] == "ab"
    assert ran["payloads"]["reply.result.stdout"]["truncated"] is True
    assert ran["reply"]["result"]["exit_code"] == 0 and ran["request"]["action"]["command"] == "cat /workspace/big"
    assert "truncated" not in ran  # cut by the redaction, so no field had to be cut whole


async def test_a_control_event_keeps_its_name_without_a_frame_and_is_not_fetched_again(tmp_path: Path) -> None:
    from corral.recording.bundle import read_bundle

    directory = tmp_path / "ses_0123456789abcded"
    controller = Controller("boot-1")
    controller.act(1)
    change = {"event": "control", "change": "taken", "holder": "human:lnk_a", "previous": "agent", "at": 1.5}
    controller.events.append({"seq": 2, **change})
    first = await _recorder(directory, controller)
    await first.fetch(0)
    # The gateway restarts after the control event: the new recorder carries on after it.
    second = await _recorder(directory, controller)
    await second.fetch(0)
    controller.act(1)
    await second.fetch(0)
    events = _events(directory)
    assert [(e["event"], e["controller_seq"]) for e in events] == [("action", 1), ("control", 2), ("action", 3)]
    noted = events[1]
    assert {k: noted[k] for k in change} == change and noted["controller_boot"] == "boot-1"
    assert "frame" not in noted and "audit" not in noted
    bundle = read_bundle(directory)
    assert [e["controller_seq"] for e in bundle.actions] == [1, 3]
    assert [e["event"] for e in bundle.events] == ["action", "control", "action"]


def _human_type(seq: int, text: str) -> dict[str, Any]:
    typed = {"type": "type", "text": text}
    return {
        "seq": seq,
        "action_id": f"h{seq}.beef",
        "dialect": "human",
        "actor": "human:lnk_abc",
        "request": {"action": typed},
        "native": [typed],
        "ok": True,
        "reply": {"ok": True, "result": {"typed": len(text)}},
    }


async def test_a_controller_that_kept_a_persons_typing_is_redacted_here(tmp_path: Path) -> None:
    # An older (or hostile) controller sends a person's text whole: the gateway leaves it out before writing.
    directory = tmp_path / "ses_0123456789abcded"
    controller = Controller("boot-1")
    controller.events.append(_human_type(1, "c0rrect-h0rse-battery"))
    recorder = await _recorder(directory, controller)
    await recorder.fetch(0)
    text = (directory / "events.jsonl").read_text()
    assert "c0rrect-h0rse" not in text
    (event,) = _events(directory)
    assert event["native"] == [{"type": "type", "redacted": True, "length": 21}]


def test_a_bundle_an_older_gateway_wrote_is_redacted_as_it_is_read_and_zipped(tmp_path: Path) -> None:
    manager = RecordingManager(tmp_path)
    directory = manager.directory("ses_0123456789abcdec")
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"format": "corral-recording", "version": 1}))
    agents = {"seq": 2, "event": "action", "dialect": "native", "request": {"action": {"type": "type", "text": "mine"}}}
    lines = [{**_human_type(1, "c0rrect-h0rse-battery"), "event": "action"}, agents]
    (directory / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = manager.events(directory.name)["events"]
    assert read[0]["native"] == [{"type": "type", "redacted": True, "length": 21}] and read[1] == agents
    out = io.BytesIO()
    manager.zip(directory.name, out)
    with zipfile.ZipFile(out) as bundle:
        zipped = bundle.read(f"{directory.name}/events.jsonl")
    assert b"c0rrect-h0rse" not in zipped and b'"text": "mine"' in zipped
    assert b"c0rrect-h0rse" in (directory / "events.jsonl").read_bytes()  # the file itself is left as it was
