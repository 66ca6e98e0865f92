"""Integration fixtures: the real corral-desktop image in a real Docker engine.

The image is built once per run (cached layers make that seconds when nothing
changed); set CORRAL_SKIP_BUILD=1 to use the image as it is.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PIL import Image, ImageChops

from corral import images
from corral.client import SandboxClient
from corral.runtime import SandboxAddress, SandboxSpec
from corral.sdk import ActionFailed, Sandbox

from .dockerutil import DockerHarness

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's, on the host


@pytest.fixture(scope="session")
def runtime() -> DockerHarness:
    """The Docker driver, with what only tests do to Docker beside it (dockerutil.py)."""
    return DockerHarness()


@pytest.fixture(scope="session")
def desktop_image(runtime: DockerHarness) -> str:
    if os.environ.get("CORRAL_SKIP_BUILD") == "1" and runtime.image_exists(images.DESKTOP_IMAGE):
        return images.DESKTOP_IMAGE
    return images.build_desktop(runtime, lambda line: None)


@pytest.fixture(scope="session", autouse=True)
def _remove_test_networks() -> Iterator[None]:
    """The networks this run made (their names end in its pid) go when it ends."""
    yield
    with contextlib.suppress(Exception):  # no engine, nothing to clean
        runtime = DockerHarness()
        for name in runtime.network_names():
            if name.startswith("corral-") and name.endswith(f"-{os.getpid()}"):
                runtime.remove_network(name)


@pytest.fixture(scope="session")
def egress_image(runtime: DockerHarness) -> str:
    if os.environ.get("CORRAL_SKIP_BUILD") == "1" and runtime.image_exists(images.EGRESS_IMAGE):
        return images.EGRESS_IMAGE
    return images.build_egress(runtime, lambda line: None)


def start_sandbox(runtime: DockerHarness, image: str, name: str) -> SandboxAddress:
    """A fresh sandbox named ``name`` (one left by an earlier run is removed first), ready."""
    runtime.remove(name)
    sandbox = runtime.start_sandbox(SandboxSpec(image=image, name=name, labels={"corral.test": "1"}))
    runtime.wait_ready(sandbox, timeout_s=90)
    return sandbox


@pytest.fixture(scope="session")
def sandbox(runtime: DockerHarness, desktop_image: str) -> Iterator[SandboxAddress]:
    box = start_sandbox(runtime, desktop_image, f"corral-it-{os.getpid()}")
    yield box
    runtime.remove(box.id)


@pytest.fixture()
def spare_sandbox(runtime: DockerHarness, desktop_image: str) -> Iterator[SandboxAddress]:
    """A sandbox of its own, for tests that break things."""
    box = start_sandbox(runtime, desktop_image, f"corral-it-spare-{os.getpid()}")
    yield box
    runtime.remove(box.id)


@pytest.fixture()
def client(sandbox: SandboxAddress) -> Iterator[SandboxClient]:
    with SandboxClient(sandbox.ws_url, controller_secret=sandbox.secret) as c:
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium on the host, driven by Playwright (imported only by the modules that use it)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, interval_s: float = 0.1) -> Any:
    """``predicate()`` once it is truthy, or its last falsy value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def agent_acts(sb: Sandbox) -> bool:
    """Whether the agent's action runs (no human's stream nor exclusive CDP connection holds the lease)."""
    try:
        sb.act({"type": "wait", "ms": 0})
    except ActionFailed:
        return False
    return True


def html_url(body: str, script: str = "") -> str:
    """A data: URL for a test page; pages report their state through document.title."""
    doc = (
        "<!doctype html><html><head><meta charset=utf-8><title>ready</title>"
        "<style>html,body{margin:0;padding:0;background:#fff;font:16px sans-serif}</style></head>"
        f"<body>{body}<script>{script}</script></body></html>"
    )
    return "data:text/html;charset=utf-8," + urllib.parse.quote(doc)


def open_page(client: SandboxClient, body: str, script: str = "") -> None:
    client.act({"type": "navigate", "url": html_url(body, script)})
    # The first frame of a new document can lag the load event; settle before looking at pixels.
    client.act({"type": "wait", "ms": 0}, wait_for="stable", screenshot=True)


def title(client: SandboxClient) -> str:
    return str(client.act({"type": "page_info"})["result"]["title"])


def await_title(
    client: SandboxClient,
    expected: str | None = None,
    *,
    until: Callable[[str], bool] | None = None,
    timeout_s: float = 15.0,
) -> str:
    """The page's title once it is ``expected`` (or satisfies ``until``, or at least left 'ready').

    Input reaches Chromium asynchronously, so a test reads the page's reaction with a bounded poll. The
    bound is generous: a CI run on 2 busy cores once saw a renderer take over 5 s to show typed text
    (test_dialects' OpenAI batch, still 'ready' at 5 s), and a title that arrives early returns at once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        current = title(client)
        left_ready = current != "ready" and (until is None or until(current))
        done = (current == expected) if expected is not None else left_ready
        if done:
            return current
        if time.monotonic() > deadline:
            return current
        time.sleep(0.02)


def await_json(client: SandboxClient, until: Callable[[Any], bool] = lambda _: True, timeout_s: float = 5.0) -> Any:
    """The title parsed as JSON once ``until`` holds for it (or the last value at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = title(client)
        state = json.loads(current) if current.startswith(("{", "[")) else None
        if state is not None and until(state):
            return state
        if time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def screenshot_image(client: SandboxClient, **options: Any) -> Image.Image:
    return Image.open(io.BytesIO(client.screenshot(**options))).convert("RGB")


def decode_image(data_b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data_b64))).convert("RGB")


def find_color(image: Image.Image, rgb: tuple[int, int, int], tolerance: int = 8) -> tuple[int, int, int, int]:
    """Bounding box (x0, y0, x1, y1) of the pixels close to ``rgb``; fails the test when there are none."""
    masks = [
        band.point(lambda v, c=c: 255 if abs(v - c) <= tolerance else 0)
        for band, c in zip(image.split(), rgb, strict=True)
    ]
    mask = ImageChops.multiply(ImageChops.multiply(masks[0], masks[1]), masks[2])
    box = mask.getbbox()
    assert box is not None, f"no pixel of colour {rgb} on the screen"
    return box


def center(box: tuple[int, int, int, int]) -> tuple[int, int]:
    return (box[0] + box[2]) // 2, (box[1] + box[3]) // 2
