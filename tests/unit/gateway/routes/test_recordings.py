"""Recordings over HTTP: who may read them, the events cursor, frames, the bundle and the viewer page."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from corral.gateway import auth
from corral.gateway.recording import OWNER_FILE
from corral.recording.bundle import EVENTS_FILE, FRAMES_DIR, MANIFEST_FILE

from .conftest import KEY, KEY_ID_SECRET, OTHER_KEY, Client, client_for, settings_for, wired

SESSION = "ses_abc123"


@pytest.fixture()
async def recording(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """A gateway that records, holding one ended recording of KEY's."""
    directory = tmp_path / "recordings" / SESSION
    (directory / FRAMES_DIR).mkdir(parents=True)
    (directory / MANIFEST_FILE).write_text(json.dumps({"format": "corral-recording", "ended_at": 2.0}))
    lines = [json.dumps({"seq": seq, "time": 1.0, "event": "action"}) + "\n" for seq in (1, 2, 3)]
    (directory / EVENTS_FILE).write_text("".join(lines))
    (directory / FRAMES_DIR / "000001.webp").write_bytes(b"RIFF....WEBP")
    (directory / OWNER_FILE).write_text(auth.key_id(KEY, KEY_ID_SECRET))
    app = wired(settings_for(tmp_path, record=True))
    yield app
    await app.state.http.aclose()


@pytest.mark.parametrize(("value", "expected"), [("0", [1, 2, 3]), ("2", [3]), ("000001", [2, 3])])
async def test_after_takes_plain_digits(recording: FastAPI, value: str, expected: list[int]) -> None:
    async with client_for(recording, KEY) as owner:
        reply = await owner.get(f"/v1/sessions/{SESSION}/recording/events", params={"after": value})
    assert reply.status_code == 200
    assert [e["seq"] for e in reply.json()["events"]] == expected and reply.json()["ended"] is True


@pytest.mark.parametrize("value", ["", "-1", "+1", " 1", "1 ", "1_0", "1.5", "abc", "١", "9" * 19])
async def test_after_refuses_anything_else(recording: FastAPI, value: str) -> None:
    async with client_for(recording, KEY) as owner:
        reply = await owner.get(f"/v1/sessions/{SESSION}/recording/events", params={"after": value})
    assert (reply.status_code, reply.json()["error"]["code"], reply.json()["error"]["field"]) == (
        400,
        "invalid_request",
        "after",
    )


async def test_a_recording_is_its_owners_only(recording: FastAPI) -> None:
    async with client_for(recording, KEY) as owner, client_for(recording, OTHER_KEY) as other:
        assert (await other.get(f"/v1/sessions/{SESSION}/recording/events", params={"after": "x"})).status_code == 403
        assert (await other.get(f"/v1/sessions/{SESSION}/recording")).status_code == 403
        assert [r["session"] for r in (await owner.get("/v1/recordings")).json()] == [SESSION]
        assert (await other.get("/v1/recordings")).json() == []
        frame = await owner.get(f"/v1/sessions/{SESSION}/recording/frames/000001.webp")
        assert frame.status_code == 200 and frame.headers["vary"] == "authorization"
        assert (await owner.get(f"/v1/sessions/{SESSION}/recording/frames/nope.webp")).status_code == 404
        bundle = await owner.get(f"/v1/sessions/{SESSION}/recording")
        assert bundle.status_code == 200 and bundle.headers["content-type"] == "application/zip"
        missing = await owner.get("/v1/sessions/ses_ffff/recording")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no recording of session ses_ffff"


async def test_the_viewer_is_served_to_anyone_and_checks_a_credential_that_comes(recording: FastAPI) -> None:
    path = f"/v1/sessions/{SESSION}/viewer"
    async with client_for(recording) as anon, client_for(recording, OTHER_KEY) as other:
        page = await anon.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        old_link = await anon.get(path, params={"token": KEY})
        assert old_link.status_code == 303 and old_link.headers["location"] == f"{path}#token={KEY}"
        assert (await anon.get(path, params={"token": "nope"})).status_code == 401
        assert (await other.get(path)).status_code == 403
        assert (await anon.get("/v1/sessions/not-a-session/viewer")).status_code == 404


async def test_a_gateway_that_does_not_record_has_no_recordings(client: Client) -> None:
    async with client(KEY) as owner:
        assert (await owner.get("/v1/recordings")).json() == []
        off = await owner.get(f"/v1/sessions/{SESSION}/recording")
    assert off.status_code == 404 and off.json()["error"]["message"] == "this gateway does not record sessions"
