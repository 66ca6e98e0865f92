"""A running browser's cookies over the controller's CDP relay: ``Storage.getCookies`` before its state is
exported, ``Storage.setCookies`` once it runs on an imported state.

Why not the cookie file alone: Chromium writes its cookie store in batches (every 30 s), and a
SIGTERM ends it through its session-ending path, which skips the last batch (measured: a cookie set
29 s before the stop was not in the file; the local storage LevelDB was). CDP's answer is the cookie
jar as the browser holds it. It is a sandbox's answer, so read to a bound and kept only as a list
of objects with the fields ``Storage.setCookies`` takes, each a string, number or boolean."""

from __future__ import annotations

import asyncio
import json

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.contracts.limits import CDP_MAX_FRAME_BYTES
from corral.errors import ProfileRefused, ProfileTooLarge, UnprovenController
from corral.gateway import controller
from corral.runtime import SandboxAddress

CDP_PATH = "/v1/cdp?conn=corral_profile&exclusive=0"
CALL_S = 15.0
# CDP's CookieParam, less what a getCookies answer has that setCookies does not take.
COOKIE_FIELDS = frozenset(
    {
        "name",
        "value",
        "domain",
        "path",
        "secure",
        "httpOnly",
        "sameSite",
        "expires",
        "priority",
        "sourceScheme",
        "sourcePort",
        "partitionKey",
    }
)
MAX_COOKIES = 10_000


def cookie_params(answer: object) -> list[dict[str, object]]:
    """The cookies of a ``Storage.getCookies`` answer as ``Storage.setCookies`` takes them; a session
    cookie (``session`` true, ``expires`` -1) stays one. :class:`ProfileRefused` for anything else. Pure."""
    cookies = answer.get("cookies") if isinstance(answer, dict) else None
    if not isinstance(cookies, list) or len(cookies) > MAX_COOKIES:
        raise ProfileRefused("the browser's cookies were not a list of at most 10000")
    params = []
    for cookie in cookies:
        if not isinstance(cookie, dict) or not isinstance(cookie.get("name"), str):
            raise ProfileRefused("a cookie the browser answered with has no name")
        kept = {key: value for key, value in cookie.items() if key in COOKIE_FIELDS and _scalar(value, key)}
        if cookie.get("session") is True or kept.get("expires") == -1:
            kept.pop("expires", None)
        params.append(kept)
    return params


def _scalar(value: object, key: str) -> bool:
    if key == "partitionKey":  # an object of two fields (topLevelSite, hasCrossSiteAncestor)
        return isinstance(value, dict) and all(isinstance(v, str | bool) for v in value.values())
    return isinstance(value, str | int | float | bool)


async def call(sandbox: SandboxAddress, method: str, params: dict[str, object]) -> dict[str, object]:
    """One browser-level CDP command through the controller's relay (which applies its rules to it)."""
    try:
        upstream = await controller.connect_ws(sandbox.ws_url, sandbox.secret, CDP_PATH, CDP_MAX_FRAME_BYTES)
    except (OSError, TimeoutError, InvalidHandshake, UnprovenController) as exc:
        raise ProfileRefused(f"the browser's DevTools did not answer: {type(exc).__name__}") from None
    try:
        async with asyncio.timeout(CALL_S):
            await upstream.send(json.dumps({"id": 1, "method": method, "params": params}))
            while True:
                answer = json.loads(await upstream.recv())
                if isinstance(answer, dict) and answer.get("id") == 1:
                    break
    except TimeoutError:
        raise ProfileRefused(f"{method} got no answer in {CALL_S:.0f}s") from None
    except (ConnectionClosed, ValueError) as exc:
        raise ProfileRefused(f"{method} failed: {type(exc).__name__}") from None
    finally:
        await upstream.close()
    if "error" in answer:
        raise ProfileRefused(f"{method} was refused: {str(answer['error'])[:200]}")
    result = answer.get("result")
    return result if isinstance(result, dict) else {}


async def read_cookies(sandbox: SandboxAddress, max_bytes: int) -> bytes:
    """The browser's cookies as JSON (``Storage.setCookies``' params), at most ``max_bytes``."""
    params = cookie_params(await call(sandbox, "Storage.getCookies", {}))
    data = json.dumps(params, separators=(",", ":")).encode()
    if len(data) > max_bytes:
        raise ProfileTooLarge(f"the browser's cookies are over {max_bytes} bytes")
    return data


async def write_cookies(sandbox: SandboxAddress, data: bytes) -> int:
    """The cookies :func:`read_cookies` read, set in the browser; how many."""
    if not data:
        return 0
    params = cookie_params({"cookies": json.loads(data)})
    if params:
        await call(sandbox, "Storage.setCookies", {"cookies": params})
    return len(params)
