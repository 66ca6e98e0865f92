"""The controller's recorder: what it keeps of a reply."""

from __future__ import annotations

from corral.sandbox.recorder import _strip_images


def test_openai_images_are_not_kept_in_recorded_replies() -> None:
    reply = {"result": {"output": {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 1000}}}
    assert _strip_images(reply)["result"]["output"]["image_url"] == "<image>"
