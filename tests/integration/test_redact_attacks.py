"""Issue 26, items 4 and 6: a person's typed text never reaches a recording, and no API-key material
reaches what a session token or a view link reads; each played as the agent (or a link's holder) would.

A person types a password through a real control link (the viewer page in a real Chromium, and the live
stream's wire for key presses) into a careful site's sign-in form, which posts it through the session's
proxy. Then everything that reads the recording looks for it: the agent's own session token (recording
events, traffic), a view link (the same), the viewer page opened with that link in a real browser, and the
downloaded bundle, every byte of every member. The password is in none of them; its length and the
``redacted`` mark are; the agent's own typing is kept as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from corral.gateway.auth import KEY_ID_KEY_FILE, key_id, legacy_key_id
from corral.sdk import Sandbox

from .conftest import center, find_color, wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, session_fixtures
from .gateway_fixtures import KEY_A, RunningGateway
from .test_takeover import BLUE, Live, Viewer, make_link, secret_of

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")
SIGNIN_PAGE = "https://allowed.test/page/signin.html"
# A paste on the viewer's live screen, as the browser fires it for ctrl+v (the clipboard's text).
PASTE = """(text) => {
  const data = new DataTransfer();
  data.setData("text/plain", text);
  document.getElementById("screen").dispatchEvent(new ClipboardEvent("paste", {clipboardData: data, bubbles: true}));
}"""


upstream, gw, _ = session_fixtures("redact")


def events_read_by(gw: RunningGateway, session_id: str, credential: str) -> list[dict[str, Any]]:
    with gw.client(credential) as c:
        response = c.get(f"/v1/sessions/{session_id}/recording/events")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def text_read_by(gw: RunningGateway, session_id: str, credential: str) -> str:
    """Everything ``credential`` reads of the session's recording and traffic, as text (a view link
    reads the traffic one action at a time, as its viewer page does)."""
    with gw.client(credential) as c:
        answers = [c.get(f"/v1/sessions/{session_id}/recording/events")]
        assert answers[0].status_code == 200, answers[0].text
        whole = c.get(f"/v1/sessions/{session_id}/traffic")
        if whole.status_code == 200:
            answers.append(whole)
        else:
            assert whole.status_code == 403 and credential.startswith("crl_link_"), whole.text
            actions = {e["action_id"] for e in answers[0].json()["events"] if e.get("action_id")}
            answers += [c.get(f"/v1/sessions/{session_id}/traffic", params={"action": a}) for a in sorted(actions)]
    assert all(r.status_code == 200 for r in answers), [(r.status_code, r.text[:200]) for r in answers]
    return "\n".join(r.text for r in answers)


def field_on(sb: Sandbox) -> tuple[int, int] | None:
    """The password field's centre on the sandbox's screen, once it is drawn."""
    try:
        return center(find_color(Image.open(io.BytesIO(sb.screenshot())).convert("RGB"), BLUE))
    except AssertionError:
        return None


def humans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "action" and str(e.get("actor", "")).startswith("human:")]


def test_a_password_typed_through_a_control_link_is_in_no_recording_anyone_reads(
    gw: RunningGateway, upstream: Upstream, runtime: DockerHarness, browser: Any, tmp_path: Path
) -> None:
    password = "Tr0ub4dor&3-" + secrets.token_hex(6)
    typed = "Zebra" + secrets.token_hex(3)  # typed on the viewer's keyboard
    keyed = "x9Kq7W"  # typed as key presses, one character each, through the live stream's wire
    agent_text = "agent-typed-" + secrets.token_hex(6)
    # Whatever encoding a reader might hold it in (a form post's %26, a JSON string), the random part shows.
    needles = (password, password.rsplit("-", 1)[1], keyed, " ".join(keyed), typed)
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.act({"type": "navigate", "url": SIGNIN_PAGE}, wait_for="stable")
        assert wait_for(lambda: sb.page_info().title == "sign in", 30), sb.page_info()
        field = wait_for(lambda: field_on(sb), 30)
        assert field, "the sign-in field never showed"
        sb.act({"type": "click", "x": field[0], "y": field[1]})
        sb.act({"type": "type", "text": agent_text})  # the agent's own typing: kept as it is

        link = make_link(gw, sb.id, "control")
        human = f"human:{link['id']}"
        viewer = Viewer(browser, link["url"])
        live: Live | None = None
        try:
            viewer.take(human)
            viewer.click(*field)
            viewer.page.keyboard.press("Control+a")  # a chord: kept
            # Pasted (from a password manager, say): the viewer sends it as one type action.
            viewer.page.evaluate(PASTE, password)
            viewer.page.keyboard.type(typed)  # typed key by key: the viewer sends bursts of it
            live = Live(gw, sb.id, secret_of(link))
            answer = live.ask({"type": "input", "action": {"type": "key", "keys": " ".join(keyed)}})
            assert answer["type"] == "ack", answer
            viewer.page.keyboard.press("Enter")
            posted = wait_for(
                lambda: [h for h in upstream.hits(runtime) if h["method"] == "POST" and h["path"] == "/signed-in"]
            )
            # The form carried the password (password=<it><keyed>, URL-encoded) to the upstream through the proxy.
            assert posted and posted[-1]["bytes"] >= len("password=") + len(password + typed + keyed), posted
            viewer.hand_back("signed in")
            viewer.wait_holder("agent")
        finally:
            if live is not None:
                live.close()
            viewer.close()

        def settled() -> list[dict[str, Any]]:
            events = events_read_by(gw, sb.id, sb.info.token)
            inputs = [e for e in humans(events) if e["native"][0]["type"] in ("type", "key")]
            returned = any(e.get("event") == "control" and e.get("change") == "returned" for e in events)
            return events if len(inputs) >= 5 and returned else []  # ctrl+a, paste, typing, the keys, Return

        events = wait_for(settled, 20)
        assert events, "the recording did not catch up"

        # The agent's own session token and a view link: the recording's events and the traffic log.
        view = make_link(gw, sb.id, "view")
        for credential in (sb.info.token, secret_of(view)):
            read = text_read_by(gw, sb.id, credential)
            assert agent_text in read
            for secret in needles:
                assert secret not in read, (credential[:12], secret)

        # What is kept: the length and the mark, of the type and of the key presses; chords as they were.
        steps = [e["native"][0] for e in humans(events)]
        redacted = [e["native"][0] for e in humans(events) if e["native"][0].get("redacted")]
        assert {step["type"] for step in redacted} == {"type", "key"}, redacted
        assert sum(s["length"] for s in redacted if s["type"] == "type") == len(password + typed), redacted
        assert len(password) in [s["length"] for s in redacted if s["type"] == "type"], redacted  # the paste, whole
        # No person's step holds text: every type and every character key is redacted, however it was split.
        assert all(step.get("redacted") for step in steps if step["type"] == "type"), steps
        assert [s["length"] for s in redacted if s["type"] == "key"] == [len(keyed)], redacted
        assert all("text" not in s and "keys" not in s for s in redacted), redacted
        chords = [
            e["native"][0]["keys"]
            for e in humans(events)
            if e["native"][0]["type"] == "key" and "keys" in e["native"][0]
        ]
        assert "ctrl+a" in [c.lower() for c in chords] and "Return" in chords, chords
        agents = [e for e in events if e.get("event") == "action" and e.get("actor") in (None, "agent")]
        assert agent_text in [step.get("text") for e in agents for step in e["native"]], agents

        # The viewer page opened with the view link, in a real browser: the step says what happened.
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(view["url"])
            # The typing may come as several type actions (the viewer sends a burst per animation frame).
            count = len(redacted)
            page.wait_for_function(
                "(n) => [...document.querySelectorAll('#actions li')]"
                ".filter(li => li.textContent.includes('(redacted)')).length === n",
                arg=count,
                timeout=20_000,
            )
            items = page.locator("#actions li").all_inner_texts()
            said = [re.search(r"typed (\d+) characters? \(redacted\)", text) for text in items]
            assert sum(int(m.group(1)) for m in said if m) == len(password + typed + keyed), items
            step = next(i for i, m in enumerate(said) if m)
            page.locator("#actions li").nth(step).click()
            page.wait_for_function("() => document.getElementById('details').textContent.includes('redacted')")
            shown = page.content() + page.inner_text("body")
            for secret in needles:
                assert secret not in shown, secret
        finally:
            page.close()
        session_id = sb.id

    # The bundle, downloaded once the session ended (its recorded responses joined): every byte of it.
    def ended_bundle() -> bytes:
        with gw.client(KEY_A) as c:
            response = c.get(f"/v1/sessions/{session_id}/recording")
        assert response.status_code == 200, response.text
        with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
            names = archive.namelist()
            ended = json.loads(archive.read(f"{session_id}/manifest.json")).get("ended_at")
            return response.content if ended and any(n.endswith("responses.mitm") for n in names) else b""

    zipped = wait_for(ended_bundle, 20)
    assert zipped, "the bundle never ended with its responses"
    with zipfile.ZipFile(io.BytesIO(zipped)) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    assert any(b"/signed-in" in data for data in members.values())  # the post is in the recorded responses
    for name, data in {**members, "bundle.zip": zipped}.items():
        for secret in needles:
            assert secret.encode() not in data, (name, secret)
            assert secret.encode("utf-16-le") not in data, (name, secret)
    assert agent_text.encode() in members[f"{session_id}/events.jsonl"]
    events_text = members[f"{session_id}/events.jsonl"].decode()
    assert '"redacted":true' in events_text and f'"length":{len(password)}' in events_text


# -- item 6: no API-key material where a session token or a link reaches ----------------------------------


def key_derivatives(key: str) -> dict[str, str]:
    """What anyone can compute from a guess of the key with public functions: the key, its unsalted
    SHA-256 (hex, and the prefix an older gateway's id held), that older id itself."""
    sha = hashlib.sha256(key.encode()).hexdigest()
    return {"key": key, "sha256": sha, "sha256[:12]": sha[:12], "legacy id": legacy_key_id(key)}


def readable_by(gw: RunningGateway, session_id: str, credential: str) -> str:
    """Everything ``credential`` can read of the session (what it is refused counts as read too)."""
    paths = [
        "",
        "/secrets",
        "/links",
        "/traffic",
        "/traffic.har",
        "/traffic.anchors",
        "/recording/events",
        "/recording",
    ]
    with gw.client(credential) as c:
        said = [c.get(f"/v1/sessions/{session_id}{path}").text for path in paths]
        said.append(c.get("/v1/sessions").text)
        said.append(c.get("/v1/audit").text)
        said.append(c.get("/v1/recordings").text)
    return "\n".join(said) + "\n" + text_read_by(gw, session_id, credential)


def test_nothing_the_agent_or_a_link_reads_holds_a_value_derived_from_the_api_key(
    gw: RunningGateway, upstream: Upstream, runtime: DockerHarness
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        # The owner acts on the session every way that leaves a record: egress changed, links made, the
        # lease taken through its own key's live stream (holder human:<who>) and handed back.
        with gw.client(KEY_A) as owner:
            changed = owner.patch(f"/v1/sessions/{sb.id}", json={"allow": ["allowed.test", "*.allowed.test"]})
            assert changed.status_code == 200, changed.text
        view = make_link(gw, sb.id, "view")
        make_link(gw, sb.id, "control")
        watching = Live(gw, sb.id, sb.info.token)  # the agent's own stream: it sees the lease's holder
        owner_live = Live(gw, sb.id, KEY_A)
        try:
            assert owner_live.ask({"type": "take"})["type"] == "ack"
            holder = watching.wait(lambda m: m["type"] == "lease" and m["lease"]["holder"] != "agent")
            assert holder is not None
            held = sb.request({"action": {"type": "control"}})  # the agent asks who holds it
            assert owner_live.ask({"type": "release", "note": "yours"})["type"] == "ack"
        finally:
            owner_live.close()
        sb.act({"type": "navigate", "url": "https://allowed.test/page/takeover.html"}, wait_for="stable")

        def recorded() -> bool:
            events = events_read_by(gw, sb.id, sb.info.token)
            return any(e.get("event") == "control" and e.get("change") == "returned" for e in events)

        assert wait_for(recorded, 20)
        read = {
            "the agent's token": readable_by(gw, sb.id, sb.info.token),
            "a view link": readable_by(gw, sb.id, secret_of(view)),
            "the agent's live stream": json.dumps(watching.messages),
            "the agent's control action": json.dumps(held),
        }
        watching.close()

        for reader, text in read.items():
            for name, value in key_derivatives(KEY_A).items():
                assert value not in text, (reader, name)
        # Who acted is still said, as the session's owner.
        assert holder["lease"]["holder"] == "human:owner", holder
        assert '"actor":"api-key:owner"' in read["the agent's token"].replace(" ", "")

        # The gateway's own id of the key is in none of them either, and it cannot be computed without the
        # gateway's secret (0600 in its data dir): the public function gives another value.
        data_dir = gw.settings.data_dir
        secret = (data_dir / KEY_ID_KEY_FILE).read_bytes()
        own_id = key_id(KEY_A, secret)
        assert json.loads((data_dir / "sessions" / f"{sb.id}.json").read_text())["owner"] == own_id
        assert stat.S_IMODE((data_dir / KEY_ID_KEY_FILE).stat().st_mode) == 0o600
        assert own_id not in key_derivatives(KEY_A).values() and own_id != key_id(KEY_A, bytes(32))
        for reader, text in read.items():
            assert own_id not in text and own_id.removeprefix("key-") not in text, reader
