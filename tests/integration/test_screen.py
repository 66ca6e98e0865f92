"""Screenshots from MIT-SHM: formats, sizes, regions, pixels, the pointer, and settle-based waiting."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from corral.client import SandboxClient, image_bytes

from .conftest import center, decode_image, find_color, html_url, open_page, screenshot_image

GREEN = (10, 200, 30)
PAINTED = f'<div id=p style="position:absolute;left:300px;top:200px;width:400px;height:200px;background:rgb{GREEN}">'


@pytest.mark.parametrize(
    ("fmt", "media_type", "magic"),
    [
        ("png", "image/png", b"\x89PNG"),
        ("jpeg", "image/jpeg", b"\xff\xd8\xff"),
        ("webp", "image/webp", b"RIFF"),
    ],
)
def test_screenshot_formats(client: SandboxClient, fmt: str, media_type: str, magic: bytes) -> None:
    reply = client.act({"type": "screenshot", "format": fmt, "quality": 70})
    shot = reply["screenshot"]
    assert shot["media_type"] == media_type
    assert (shot["width"], shot["height"]) == (1280, 800)
    data = image_bytes(reply)
    assert data.startswith(magic)
    assert Image.open(io.BytesIO(data)).size == (1280, 800)


def test_pixels_of_a_painted_page(client: SandboxClient) -> None:
    open_page(client, PAINTED)
    image = screenshot_image(client)
    box = find_color(image, GREEN, tolerance=2)
    assert (box[2] - box[0], box[3] - box[1]) == (400, 200)  # exact: device scale factor 1, no smoothing
    assert image.getpixel(center(box)) == GREEN


def test_region_and_resize(client: SandboxClient) -> None:
    open_page(client, PAINTED)
    box = find_color(screenshot_image(client), GREEN, tolerance=2)
    region = {"x": box[0] + 10, "y": box[1] + 10, "width": 100, "height": 50}
    cropped = screenshot_image(client, region=region)
    assert cropped.size == (100, 50)
    assert cropped.getpixel((50, 25)) == GREEN
    assert screenshot_image(client, width=640).size == (640, 400)
    assert screenshot_image(client, scale=0.25).size == (320, 200)


def test_zoom_is_full_resolution(client: SandboxClient) -> None:
    reply = client.act({"type": "zoom", "region": {"x": 0, "y": 0, "width": 320, "height": 200}})
    assert (reply["screenshot"]["width"], reply["screenshot"]["height"]) == (320, 200)
    reply = client.act({"type": "zoom", "region": {"x": 0, "y": 0, "width": 320, "height": 200}, "width": 1280})
    assert (reply["screenshot"]["width"], reply["screenshot"]["height"]) == (1280, 800)


def test_cursor_overlay(client: SandboxClient) -> None:
    open_page(client, PAINTED)
    box = find_color(screenshot_image(client), GREEN, tolerance=2)
    x, y = center(box)
    client.act({"type": "move", "x": x, "y": y})
    plain = screenshot_image(client, region={"x": x, "y": y, "width": 12, "height": 12})
    with_cursor = screenshot_image(client, region={"x": x, "y": y, "width": 12, "height": 12}, cursor=True)
    assert {color for _, color in plain.getcolors()} == {GREEN}
    assert {color for _, color in with_cursor.getcolors()} != {GREEN}  # the arrow's pixels are drawn over the page


DELAYED = """<div id=p style="position:absolute;left:300px;top:200px;width:400px;height:200px;background:#f00"></div>"""
DELAYED_JS = """
document.addEventListener('click', () => setTimeout(() => {
  document.getElementById('p').style.background = 'rgb(10,200,30)'; }, 400));
"""


def test_wait_for_stable_sees_a_late_change(client: SandboxClient) -> None:
    open_page(client, DELAYED, DELAYED_JS)
    # A quiet window longer than the page's delay: the screenshot must come after the change.
    reply = client.act({"type": "click", "x": 100, "y": 600}, screenshot=True, wait_for="stable", settle_quiet_ms=600)
    shot = reply["screenshot"]
    assert shot["settled"] is True
    assert shot["settle_ms"] >= 400
    image = decode_image(shot["data"])
    assert find_color(image, GREEN, tolerance=2)


def test_settle_is_capped_on_a_page_that_never_stops(client: SandboxClient) -> None:
    spinner = "<div id=s style='width:300px;height:300px;background:#000'></div>"
    js = (
        "let k=0; setInterval(() => { k++;"
        " document.getElementById('s').style.background = k%2 ? '#fff' : '#000'; }, 30);"
    )
    # open_page would wait for a stable screen, which this page never gives.
    client.act({"type": "navigate", "url": html_url(spinner, js)})
    reply = client.act({"type": "wait", "ms": 0}, screenshot=True, wait_for="stable", settle_timeout_ms=500)
    assert reply["screenshot"]["settled"] is False
    assert 450 <= reply["screenshot"]["settle_ms"] < 1500
