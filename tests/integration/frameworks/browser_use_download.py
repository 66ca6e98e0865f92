"""browser-use's browser layer (no agent, no model) downloading through Corral: connect with
``cdp_url`` and ``headers`` and a downloads folder of this machine, open a page, click its download
link, and print the ``FileDownloadedEvent`` browser-use dispatched for Chromium's download (its
GUID, the path it reports on this machine, the size it saw) as one JSON line. The file itself is
fetched through Corral's downloads API by its GUID. Run by tests/integration/test_downloads.py in .venv-browser-use:

    python browser_use_download.py <cdp url> <session token> <page url> <downloads folder>
"""

from __future__ import annotations

import asyncio
import json
import sys

from browser_use import BrowserSession
from browser_use.browser.events import FileDownloadedEvent


async def probe(cdp_url: str, token: str, url: str, folder: str) -> dict[str, object]:
    session = BrowserSession(
        cdp_url=cdp_url, headers={"Authorization": f"Bearer {token}"}, headless=False, downloads_path=folder
    )
    seen: asyncio.Future[FileDownloadedEvent] = asyncio.get_running_loop().create_future()

    def downloaded(event: FileDownloadedEvent) -> None:
        # The report of Chromium's download carries its GUID; browser-use's own second fetch of an
        # attachment it saw on the network (its "auto download") carries none.
        if event.guid and not seen.done():
            seen.set_result(event)

    session.event_bus.on(FileDownloadedEvent, downloaded)
    await session.start()
    try:
        await session.navigate_to(url)
        page = await session.must_get_current_page()
        await page.evaluate("() => document.getElementById('get').click()")
        event = await asyncio.wait_for(seen, 30)
        return {"guid": event.guid, "path": event.path, "file_size": event.file_size, "url": event.url}
    finally:
        await session.stop()


if __name__ == "__main__":
    cdp_url, token, url, folder = sys.argv[1:5]
    print(json.dumps(asyncio.run(probe(cdp_url, token, url, folder))), flush=True)
