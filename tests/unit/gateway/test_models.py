from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from corral.gateway.models import CreateSession, UpdateSession


def test_defaults() -> None:
    body = CreateSession()
    assert body.allow == [] and body.labels == {}
    assert (body.viewport.width, body.viewport.height) == (1280, 800)
    assert body.timeout_s is None and body.idle_timeout_s is None


@pytest.mark.parametrize(
    "raw",
    [
        {"colour": "red"},
        {"allow": ["has space"]},
        {"allow": ["x" * 300]},
        {"viewport": {"width": 100, "height": 800}},
        {"viewport": {"width": 1280, "height": 800, "depth": 24}},
        {"timeout_s": 0},
        {"idle_timeout_s": -5},
        {"labels": {"k": "v" * 300}},
        {"resources": {"cpus": 0}},
        {"resources": {"memory_mb": 10}},
    ],
)
def test_bad_bodies_are_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CreateSession.model_validate(raw)


def test_wildcards_and_ports_are_valid_hosts() -> None:
    body = CreateSession.model_validate({"allow": ["example.com", "*.example.org", "api.test:8443"]})
    assert body.allow == ["example.com", "*.example.org", "api.test:8443"]


def test_allow_entries_use_the_egress_grammar_and_are_stored_canonically() -> None:
    body = CreateSession.model_validate({"allow": ["Example.COM.", "get,head Docs.example.test/guide/", "bücher.test"]})
    assert body.allow == ["example.com", "GET,HEAD docs.example.test/guide/", "xn--bcher-kva.test"]
    with pytest.raises(ValidationError) as exc:
        CreateSession.model_validate({"allow": ["ok.test", "FETCH x.test"]})
    assert exc.value.errors()[0]["loc"] == ("allow", 1)


VALUE = "the-real-value-0123"
SPEC = {"value": VALUE, "allow": ["api.example.test"]}


def test_a_secret_defaults_to_headers_and_never_shows_its_value() -> None:
    body = CreateSession.model_validate({"allow": ["api.example.test"], "secrets": {"GITHUB_TOKEN": SPEC}})
    spec = body.secrets["GITHUB_TOKEN"]
    assert (spec.value.get_secret_value(), spec.allow, spec.in_) == (VALUE, ["api.example.test"], ["header"])
    assert VALUE not in repr(body) and VALUE not in str(body) and VALUE not in body.model_dump_json()
    assert CreateSession().secrets == {} and UpdateSession().secrets is None


@pytest.mark.parametrize(
    ("secrets", "loc", "words"),
    [
        ({"github": SPEC}, ("secrets", "github", "[key]"), "A-Z 0-9 _"),
        ({"LD_PRELOAD": SPEC}, ("secrets", "LD_PRELOAD", "[key]"), "reserved"),
        ({"S": {**SPEC, "value": "short"}}, ("secrets", "S", "value"), "at least 8"),
        ({"S": {**SPEC, "value": "é" * 2049}}, ("secrets", "S", "value"), "at most 4096 bytes"),
        ({"S": {**SPEC, "value": VALUE + "\n"}}, ("secrets", "S", "value"), "CR or LF"),
        ({"S": {**SPEC, "value": VALUE + "\x00"}}, ("secrets", "S", "value"), "NUL"),
        ({"S": {**SPEC, "value": "corral_secret_" + "0" * 32}}, ("secrets", "S", "value"), "placeholder"),
        ({"S": {**SPEC, "value": 12345678}}, ("secrets", "S", "value"), "string"),
        ({"S": {"value": VALUE}}, ("secrets", "S", "allow"), "Field required"),
        ({"S": {**SPEC, "allow": ["FETCH api.example.test"]}}, ("secrets", "S", "allow", 0), "unknown method"),
        ({"S": {**SPEC, "allow": ["a.test"] * 17}}, ("secrets", "S", "allow"), "at most 16"),
        ({"S": {**SPEC, "in": ["cookie"]}}, ("secrets", "S", "in", 0), "'header'"),
        ({f"S{i}": SPEC for i in range(33)}, ("secrets",), "at most 32"),
    ],
)
def test_a_bad_secret_is_refused_where_it_is_and_never_quoted(
    secrets: dict[str, Any], loc: tuple[Any, ...], words: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        CreateSession.model_validate({"allow": ["api.example.test"], "secrets": secrets})
    [error] = exc.value.errors(include_input=False)
    assert error["loc"] == loc and words in error["msg"]
    assert VALUE not in error["msg"] and "é" * 8 not in error["msg"]


def test_a_patch_names_its_changes_and_nulls_revoke() -> None:
    body = UpdateSession.model_validate(
        {"secrets": {"A": None, "B": {"value": VALUE}, "C": {"allow": ["x.test"], "in": ["query", "basic"]}}}
    )
    assert body.secrets is not None and body.secrets["A"] is None
    assert body.secrets["B"] is not None and body.secrets["B"].allow is None
    assert body.secrets["C"] is not None and body.secrets["C"].in_ == ["query", "basic"]
    with pytest.raises(ValidationError) as exc:
        UpdateSession.model_validate({"secrets": {"B": {}}})
    assert exc.value.errors()[0]["loc"] == ("secrets", "B")
