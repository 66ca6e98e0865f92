"""Which addresses the agent may open in the browser: web pages only, the same rule for every door.

Native ``navigate`` and ``tab_new`` (and so MCP's navigate and new_tab tools and the vendors' calls
that plan to them) check it when the request is read; the CDP relay checks ``Page.navigate`` and
``Target.createTarget`` with it (corral.contracts.cdprules, rule ``internal_pages``). Pure.

Allowed: ``http:``, ``https:``, ``data:``, ``blob:``, ``about:blank`` (and an empty URL, which is
about:blank). ``data:`` and ``blob:`` hold a page the agent made, with no more reach than a web page.
Refused, each for what it would give: ``chrome:`` and ``about:`` other than blank (Chromium's own
pages: crash, kill, hang, quit, settings, the proxy's configuration), ``devtools:`` (the DevTools
front end's privileged bindings), ``chrome-extension:`` and ``chrome-untrusted:`` (privileged
extension and WebUI pages), ``file:`` (files Chromium's uid can read, not the agent's file actions'),
``view-source:`` (any of those, shown as source), ``javascript:`` (a script run in the page on show,
not a navigation), and every other scheme (``mailto:``, ``ftp:``, ``ws:``...: an external handler or
no page at all).
"""

from __future__ import annotations

import re
from typing import Final

# After what Chromium's URL parser drops (leading C0 controls and spaces, tabs and newlines anywhere).
_WEB_URL: Final = re.compile(r"(?:https?|data|blob):|about:blank(?:[?#].*)?\Z", re.IGNORECASE | re.DOTALL)
_IGNORED_IN_URL: Final = re.compile(r"[\t\n\r]")
_LEADING: Final = "".join(map(chr, range(0x21)))

REFUSED_WHY: Final = "only http, https, data:, blob: and about:blank pages may be opened (not chrome://, file://, ...)"


def cleaned(url: str) -> str:
    """``url`` as Chromium's URL parser reads it: without leading C0 controls and spaces, nor tabs and newlines."""
    return _IGNORED_IN_URL.sub("", url.lstrip(_LEADING))


def web_url(url: str) -> bool:
    """Whether ``url`` is a web page's (http, https, data:, blob:, about:blank; empty is about:blank)."""
    read = cleaned(url)
    return read == "" or _WEB_URL.match(read) is not None
