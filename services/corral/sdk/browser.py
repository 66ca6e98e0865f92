"""The browser's pages and tabs, a part of each twin (:class:`Browser`, :class:`AsyncBrowser`)."""

from __future__ import annotations

from typing import Unpack

from corral.protocol.results import Navigated, PageShown, Tab, TabClosed, TabShown
from corral.sdk.connection import AsyncConnected, Connected
from corral.sdk.messages import PageOptions, messages


class Browser(Connected):
    """The browser's pages and tabs: each action answers its result model (the page's URL and title,
    a tab)."""

    def navigate(self, url: str, **options: Unpack[PageOptions]) -> Navigated:
        return self._send(messages.navigate(url, options))

    def back(self) -> PageShown:
        return self._send(messages.page("back"))

    def forward(self) -> PageShown:
        return self._send(messages.page("forward"))

    def reload(self) -> PageShown:
        return self._send(messages.page("reload"))

    def page_info(self) -> PageShown:
        return self._send(messages.page("page_info"))

    def tabs(self) -> list[Tab]:
        return self._send(messages.tabs())

    def tab_new(self, url: str | None = None) -> TabShown:
        return self._send(messages.tab_new(url))

    def tab_switch(self, tab: str | int) -> TabShown:
        return self._send(messages.tab_switch(tab))

    def tab_close(self, tab: str | int | None = None) -> TabClosed:
        return self._send(messages.tab_close(tab))


class AsyncBrowser(AsyncConnected):
    """The async twin of :class:`Browser`: each action answers its result model (the page's URL and title,
    a tab)."""

    async def navigate(self, url: str, **options: Unpack[PageOptions]) -> Navigated:
        return await self._send(messages.navigate(url, options))

    async def back(self) -> PageShown:
        return await self._send(messages.page("back"))

    async def forward(self) -> PageShown:
        return await self._send(messages.page("forward"))

    async def reload(self) -> PageShown:
        return await self._send(messages.page("reload"))

    async def page_info(self) -> PageShown:
        return await self._send(messages.page("page_info"))

    async def tabs(self) -> list[Tab]:
        return await self._send(messages.tabs())

    async def tab_new(self, url: str | None = None) -> TabShown:
        return await self._send(messages.tab_new(url))

    async def tab_switch(self, tab: str | int) -> TabShown:
        return await self._send(messages.tab_switch(tab))

    async def tab_close(self, tab: str | int | None = None) -> TabClosed:
        return await self._send(messages.tab_close(tab))
