"""The session's placeholders as the controller holds them, and what a ``PUT /v1/secrets`` body may say."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts.placeholders import MAX_SECRETS, new_placeholder
from corral.errors import ActionError, ErrorCode
from corral.sandbox.placeholders import Placeholders, placeholders_of

TOKEN = new_placeholder()
OTHER = new_placeholder()


def test_a_set_is_replaced_whole_and_what_was_handed_out_stays_as_it_was() -> None:
    held = Placeholders()
    assert dict(held.by_name) == {}
    held.replace({"GITHUB_TOKEN": TOKEN, "NPM_TOKEN": OTHER})
    before = held.by_name
    held.replace({"NPM_TOKEN": OTHER})  # GITHUB_TOKEN revoked: left out of the set
    assert dict(held.by_name) == {"NPM_TOKEN": OTHER}
    assert dict(before) == {"GITHUB_TOKEN": TOKEN, "NPM_TOKEN": OTHER}
    with pytest.raises(TypeError):
        held.by_name["X"] = TOKEN  # type: ignore[index]


def test_the_holder_keeps_its_own_copy() -> None:
    given = {"GITHUB_TOKEN": TOKEN}
    held = Placeholders(given)
    given["GITHUB_TOKEN"] = OTHER
    assert dict(held.by_name) == {"GITHUB_TOKEN": TOKEN}


def test_a_good_body_gives_its_names_and_placeholders() -> None:
    assert placeholders_of({"secrets": {"GITHUB_TOKEN": TOKEN, "DB_PASSWORD": OTHER}}) == {
        "GITHUB_TOKEN": TOKEN,
        "DB_PASSWORD": OTHER,
    }
    assert placeholders_of({"secrets": {}}) == {}  # every secret revoked
    many = {f"S{i}": new_placeholder() for i in range(MAX_SECRETS)}
    assert placeholders_of({"secrets": many}) == many


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, ErrorCode.MISSING_FIELD, "secrets"),
        ({"secrets": {}, "values": {}}, ErrorCode.UNKNOWN_FIELD, "values"),
        ({"secrets": ["GITHUB_TOKEN"]}, ErrorCode.INVALID_FIELD, "secrets"),
        ({"secrets": {f"S{i}": new_placeholder() for i in range(MAX_SECRETS + 1)}}, ErrorCode.INVALID_FIELD, "secrets"),
        ({"secrets": {"github_token": TOKEN}}, ErrorCode.INVALID_FIELD, "secrets.github_token"),
        ({"secrets": {"PATH": TOKEN}}, ErrorCode.INVALID_FIELD, "secrets.PATH"),
        ({"secrets": {"HTTPS_PROXY": TOKEN}}, ErrorCode.INVALID_FIELD, "secrets.HTTPS_PROXY"),
        ({"secrets": {"LD_PRELOAD": TOKEN}}, ErrorCode.INVALID_FIELD, "secrets.LD_PRELOAD"),
        ({"secrets": {"GITHUB_TOKEN": "ghp_the_real_value_1234"}}, ErrorCode.INVALID_FIELD, "secrets.GITHUB_TOKEN"),
        ({"secrets": {"GITHUB_TOKEN": TOKEN.upper()}}, ErrorCode.INVALID_FIELD, "secrets.GITHUB_TOKEN"),
        ({"secrets": {"GITHUB_TOKEN": TOKEN + "0"}}, ErrorCode.INVALID_FIELD, "secrets.GITHUB_TOKEN"),
        ({"secrets": {"GITHUB_TOKEN": f" {TOKEN}"}}, ErrorCode.INVALID_FIELD, "secrets.GITHUB_TOKEN"),
        ({"secrets": {"GITHUB_TOKEN": None}}, ErrorCode.INVALID_FIELD, "secrets.GITHUB_TOKEN"),
        ({"secrets": {"A": TOKEN, "B": TOKEN}}, ErrorCode.INVALID_FIELD, "secrets.B"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(body: dict[str, Any], code: ErrorCode, field: str) -> None:
    with pytest.raises(ActionError) as caught:
        placeholders_of(body)
    assert (caught.value.code, caught.value.field) == (code, field)


def test_a_refusal_never_quotes_what_was_given_for_a_placeholder() -> None:
    # Whatever the caller mistook for a placeholder might be a value: it stays out of the message.
    with pytest.raises(ActionError) as caught:
        placeholders_of({"secrets": {"GITHUB_TOKEN": "ghp_the_real_value_1234"}})
    assert "ghp_the_real_value_1234" not in caught.value.message
