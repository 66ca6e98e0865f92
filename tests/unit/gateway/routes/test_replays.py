"""``/v1/replay-responses``: uploads checked, capped and owned."""

from __future__ import annotations

from pathlib import Path

from .conftest import KEY, OTHER_KEY, Client, client_for, settings_for, wired


async def test_an_upload_that_is_no_flow_file_is_refused(client: Client) -> None:
    async with client(KEY) as owner:
        reply = await owner.post("/v1/replay-responses", content=b"not a flow file")
    assert reply.status_code == 422 and reply.json()["error"]["code"] == "invalid_request"
    assert reply.json()["error"]["message"].endswith("send a recording's responses.mitm")


async def test_an_upload_over_the_cap_is_413(tmp_path: Path) -> None:
    app = wired(settings_for(tmp_path, replay_upload_max_mb=1))
    async with client_for(app, KEY) as owner:
        reply = await owner.post("/v1/replay-responses", content=b"x" * ((1 << 20) + 1))
    await app.state.http.aclose()
    assert reply.status_code == 413
    assert reply.json()["error"] == {"code": "too_large", "message": "recorded responses are limited to 1 MiB"}
    assert list((tmp_path / "replay-responses").iterdir()) == []  # the part is gone too


async def test_an_empty_upload_is_kept_and_only_its_owner_deletes_it(client: Client) -> None:
    async with client(KEY) as owner, client(OTHER_KEY) as other:
        made = await owner.post("/v1/replay-responses", content=b"")
        assert made.status_code == 201
        upload = made.json()
        assert (upload["flows"], upload["bytes"], upload["torn"]) == (0, 0, False)
        refused = await other.delete(f"/v1/replay-responses/{upload['id']}")
        # Another key's upload does not exist for it; the id is the path's, no field to blame.
        assert refused.status_code == 404 and "field" not in refused.json()["error"]
        assert (await owner.delete(f"/v1/replay-responses/{upload['id']}")).status_code == 204
        assert (await owner.delete(f"/v1/replay-responses/{upload['id']}")).status_code == 404
        assert (await owner.delete("/v1/replay-responses/nonsense")).status_code == 404
