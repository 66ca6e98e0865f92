"""Reading recording bundles: what a good one gives, and a clear error for each way one can be bad."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from corral.recording.bundle import BundleError, read_bundle

MANIFEST = {"format": "corral-recording", "version": 1, "session": "ses_1", "viewport": {"width": 1280, "height": 800}}


def _bundle(tmp_path: Path, manifest: object = MANIFEST, events: bytes | None = None) -> Path:
    root = tmp_path / "b"
    (root / "frames").mkdir(parents=True)
    (root / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    (root / "frames" / "000001.webp").write_bytes(b"RIFF....WEBP")
    if events is None:
        events = (
            json.dumps({"seq": 1, "event": "action", "frame": "frames/000001.webp"})
            + "\n"
            + json.dumps({"seq": 2, "event": "gap", "lost": 3})
            + "\n"
        ).encode()
    (root / "events.jsonl").write_bytes(events)
    return root


def test_a_directory_and_its_zip_read_the_same(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    zipped = tmp_path / "b.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for path in root.rglob("*"):
            if path.is_file():
                archive.write(path, f"ses_1/{path.relative_to(root)}")
    for source in (root, zipped):
        bundle = read_bundle(source)
        assert [e["seq"] for e in bundle.events] == [1, 2] and len(bundle.actions) == 1
        assert bundle.frame(bundle.actions[0]) == b"RIFF....WEBP" and not bundle.truncated


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    good = json.dumps({"seq": 1, "event": "action", "frame": None}) + "\n"
    bundle = read_bundle(_bundle(tmp_path, events=(good + '{"seq": 2, "ev').encode()))
    assert bundle.truncated and [e["seq"] for e in bundle.events] == [1]


@pytest.mark.parametrize(
    ("manifest", "events", "message"),
    [
        ("{not json", None, "manifest.json is not valid JSON"),
        ({"format": "har", "version": 1}, None, "not a Corral recording"),
        ({**MANIFEST, "version": 7}, None, "version 7"),
        ({**MANIFEST, "viewport": None}, None, "no viewport"),
        (MANIFEST, b"nope\n", "line 1 is not valid JSON"),
        (MANIFEST, b'{"seq": "1", "event": "action"}\n', "line 1 is not a recording event"),
        (MANIFEST, b'{"seq": 2, "event": "gap"}\n{"seq": 1, "event": "gap"}\n', "line 2 is out of order"),
        (MANIFEST, b'{"seq": 1, "event": "action", "frame": "frames/9.webp"}\n', "frames/9.webp, which is missing"),
    ],
)
def test_bad_bundles_get_a_clear_error(tmp_path: Path, manifest: object, events: bytes | None, message: str) -> None:
    with pytest.raises(BundleError, match=message):
        read_bundle(_bundle(tmp_path, manifest, events))


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such file"):
        read_bundle(tmp_path / "missing")
    junk = tmp_path / "x.zip"
    junk.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match=r"neither a directory nor a \.zip"):
        read_bundle(junk)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(BundleError, match=r"no manifest\.json"):
        read_bundle(other)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"frame": ["x"]}, "outside frames/"),
        ({"frame": "manifest.json"}, "outside frames/"),
        ({"native": "x"}, "not a list"),
        ({"started": "abc"}, "not a time"),
    ],
)
def test_malformed_action_fields_are_named(tmp_path: Path, event: dict[str, object], message: str) -> None:
    line = json.dumps({"seq": 1, "event": "action", **event}).encode() + b"\n"
    with pytest.raises(BundleError, match=message):
        read_bundle(_bundle(tmp_path, events=line))
