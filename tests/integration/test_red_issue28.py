"""Issue 28's red team, for real: attacks on what the issue added (closing the last page, downloads),
played by a page served by the fake upstream through the session's proxy, or by the agent's own
token and CDP connection."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from corral.sdk import Sandbox

from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-red28-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-red28-upstream")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("red28-gw"), f"red28-{os.getpid()}") as running:
        yield running


def _chromium_pid(sb: Sandbox) -> str:
    return sb.exec(["pgrep", "-o", "-x", "chromium"]).stdout.strip()


def test_a_tab_opened_by_a_link_closes_itself_as_the_last_page_and_chromium_stays(gw: RunningGateway) -> None:
    """A page may close its own tab when its history holds one entry (a tab a link opened). The agent
    clicks the link, closes the tab it clicked in, and the new tab's timer closes it: the last window,
    with which headful Chromium quits (it does: the init restarts it, every tab and the pages' state
    lost). What holds: Chromium stays up (it runs without a window: docs/design/0384), a page is open
    again at once (the controller's), and the agent's next action has it."""
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.navigate("http://allowed.test/page/open-closer.html")
        before = _chromium_pid(sb)
        sb.click(200, 200)  # the whole page is the link: a new tab, history of one entry
        tabs = wait_for(lambda: (lambda t: t if len(t) == 2 else None)(sb.tabs()))
        assert tabs[1].url.endswith("/page/close-self.html")
        sb.tab_close(tabs[0].id)
        # The page's timer (1.5 s after its load) closes the last tab.
        time.sleep(3)
        tabs_after = sb.tabs()
        assert all("close-self" not in tab.url for tab in tabs_after)
        assert _chromium_pid(sb) == before  # the same Chromium: it never quit
        assert [tab.url for tab in tabs_after] == ["about:blank"]  # the page the controller opened
        assert sb.navigate("http://allowed.test/page/open-closer.html").title == "open closer"
