"""browser-use's browser layer (no agent, no model) against Corral's CDP endpoint: connect with
``cdp_url`` and ``headers``, navigate, read the page as browser-use's agent would see it, and print
what it read as one JSON line. Run by tests/integration/test_cdp_frameworks.py in .venv-browser-use
(scripts/bootstrap-frameworks), with browser-use's telemetry, cloud sync and version check off.

    python browser_use_probe.py <cdp url> <session token> <page url>
"""

from __future__ import annotations

import asyncio
import json
import sys

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


if __name__ == "__main__":
    cdp_url, token, url = sys.argv[1:4]
    print(json.dumps(asyncio.run(probe(cdp_url, token, url))), flush=True)
