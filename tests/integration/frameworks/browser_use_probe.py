"""browser-use's browser layer (no agent, no model) against Corral's CDP endpoint: connect with
``cdp_url`` and ``headers``, navigate, read the page as browser-use's agent would see it, and print
what it read as one JSON line. Run by tests/integration/test_cdp_frameworks.py in .venv-browser-use
(scripts/bootstrap-frameworks), with browser-use's telemetry, cloud sync and version check off.
With ``close`` last, it instead opens a tab and closes it, then closes every page left (the last one
too), then the browser (``kill``), and prints how long each step took (a step that never returns is
reported after STEP_LIMIT_S rather than left hanging).

    python browser_use_probe.py <cdp url> <session token> <page url> [close]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable

from browser_use import BrowserSession


async def probe(cdp_url: str, token: str, url: str) -> dict[str, object]:
    # headless=False: the sandbox's Chromium is headful; browser-use then lets the page fit the window
    # (no viewport emulation, which would change what the agent's own screenshots show).
    session = BrowserSession(cdp_url=cdp_url, headers={"Authorization": f"Bearer {token}"}, headless=False)
    await session.start()
    try:
        await session.navigate_to(url)
        state = await session.get_browser_state_summary(include_screenshot=False)
        page = await session.must_get_current_page()
        text = await page.evaluate("() => document.body.innerText")
        return {
            "url": await page.get_url(),
            "title": await page.get_title(),
            "text": text,
            "tabs": len(state.tabs),
            "dom": state.dom_state.llm_representation(),
        }
    finally:
        await session.stop()


STEP_LIMIT_S = 30.0


async def timed(steps: list[dict[str, object]], step: str, run: Awaitable[object]) -> None:
    started = time.monotonic()
    try:
        await asyncio.wait_for(run, STEP_LIMIT_S)
        steps.append({"step": step, "ms": round((time.monotonic() - started) * 1000)})
    except Exception as exc:  # reported, so the test names the step that failed or hung
        steps.append({"step": step, "ms": round((time.monotonic() - started) * 1000), "error": repr(exc)})


async def close_everything(cdp_url: str, token: str, url: str) -> dict[str, object]:
    session = BrowserSession(cdp_url=cdp_url, headers={"Authorization": f"Bearer {token}"}, headless=False)
    await session.start()
    steps: list[dict[str, object]] = []
    opened = await session.new_page(url)
    await timed(steps, "close_opened", session.close_page(opened))
    left = [target.target_id for target in session.get_page_targets() if target.target_id != opened._target_id]
    for target_id in left:
        await timed(steps, "close_page", session.close_page(target_id))
    await timed(steps, "close_browser", session.kill())
    return {"steps": steps, "pages_left": len(left)}


if __name__ == "__main__":
    cdp_url, token, url = sys.argv[1:4]
    run = close_everything if sys.argv[4:] == ["close"] else probe
    print(json.dumps(asyncio.run(run(cdp_url, token, url))), flush=True)
