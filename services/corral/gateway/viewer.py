"""The session viewer: one self-contained page, served by the gateway, for a live or recorded session.

A timeline to scrub through the frames, the list of actions, and for the chosen action what it
was, how it went and the network requests it caused (from the egress audit log); a command shows
its command, cwd, exit code, duration and recorded output, a file operation its path, size and
sha256 (all of it the sandbox's text, so only ever set as text, never parsed as HTML). It is opened as
``viewer#link=<viewer link secret>`` or ``viewer#token=<API key or session token>``: the fragment
never leaves the browser, and the page sends the credential only as an ``Authorization`` header on
its own fetches and as the first message of its live stream, so it appears in no URL, server log or
Referer. Frames come through ``fetch`` too (an ``<img>`` cannot send a header) and are shown from
``blob:`` URLs. While the session lives the page asks for the events after the last one it has, one
request at a time, and stops once the recording says it has ended.

While it lives the page also opens ``WS /v1/sessions/{id}/live`` (same origin: CSP ``connect-src
'self'``): the screen drawn on a canvas from the stream's JPEG frames, who holds the control lease
and since when, the agent's request for help, and for a control link or the owner's key "Take
control" and "Hand back" (with a note); while it holds the lease the canvas's pointer, wheel, keys
and paste go to the sandbox as input actions (design: docs/gateway.md's live stream). Human, CDP
and lease events from the recording are listed with who did them.

The page itself (HTML, its one ``<style>`` and one ``<script>``) is ``viewer.html`` beside this module.
"""

from __future__ import annotations

import html
import json
import secrets
from importlib import resources
from typing import NamedTuple

POLL_MS = 2000  # between the end of one events request and the start of the next
RETRY_MS = 2000  # before the live stream reconnects after it dropped (not after a refusal or revocation)

# Sent with the page and with the redirect from an old ``?token=`` link.
VIEWER_HEADERS: dict[str, str] = {
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}

_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)

# The page (HTML, its one <style> and one <script>) is package data, read once: placeholders
# __TITLE__, __SESSION__, __POLL_MS__, __RETRY_MS__ and __NONCE__ are filled per request.
_PAGE = resources.files("corral.gateway").joinpath("viewer.html").read_text(encoding="utf-8")


class ViewerPage(NamedTuple):
    body: str
    headers: dict[str, str]


def viewer_page(session_id: str) -> ViewerPage:
    """The page for ``session_id`` (a well-formed id) with its headers: a fresh CSP nonce each time."""
    nonce = secrets.token_urlsafe(18)
    # Plain substitution: the page is full of braces (CSS, JavaScript).
    body = (
        _PAGE.replace("__TITLE__", html.escape(session_id))
        .replace("__SESSION__", json.dumps(session_id))
        .replace("__POLL_MS__", str(POLL_MS))
        .replace("__RETRY_MS__", str(RETRY_MS))
        .replace("__NONCE__", nonce)
    )
    return ViewerPage(body, {**VIEWER_HEADERS, "content-security-policy": _CSP.format(nonce=nonce)})
