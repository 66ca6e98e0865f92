from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from corral.gateway.models import CreateSession


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
