"""What the gateway keeps of a browser's cookie jar (a sandbox's answer): setCookies' fields only."""

from __future__ import annotations

import pytest

from corral.errors import ProfileRefused
from corral.gateway.sessions.browsercookies import cookie_params


def test_cookies_keep_what_set_cookies_takes_and_session_cookies_stay_session_cookies() -> None:
    answer = {
        "cookies": [
            {
                "name": "sid",
                "value": "v",
                "domain": "shop.test",
                "path": "/",
                "expires": 1.9e9,
                "size": 4,
                "httpOnly": True,
                "secure": True,
                "session": False,
                "sameSite": "Lax",
                "priority": "Medium",
            },
            {"name": "tmp", "value": "t", "domain": "shop.test", "path": "/", "expires": -1, "session": True},
            {"name": "odd", "value": "o", "domain": "shop.test", "path": {"not": "a string"}},
        ]
    }
    kept = cookie_params(answer)
    assert kept[0] == {
        "name": "sid",
        "value": "v",
        "domain": "shop.test",
        "path": "/",
        "expires": 1.9e9,
        "httpOnly": True,
        "secure": True,
        "sameSite": "Lax",
        "priority": "Medium",
    }
    assert kept[1] == {"name": "tmp", "value": "t", "domain": "shop.test", "path": "/"}
    assert "path" not in kept[2]


@pytest.mark.parametrize("answer", [None, {"cookies": "x"}, {"cookies": [1]}, {"cookies": [{"value": "v"}]}])
def test_anything_but_a_list_of_named_cookies_is_refused(answer: object) -> None:
    with pytest.raises(ProfileRefused):
        cookie_params(answer)
