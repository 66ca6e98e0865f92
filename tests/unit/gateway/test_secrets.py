"""corral.gateway.secrets, pure: which bindings an allowlist covers, a declaration and a change planned
whole (or refused with the field to blame), the proxy's message, and the vault."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts.placeholders import MAX_SECRETS, PLACEHOLDER
from corral.errors import InvalidRequest
from corral.gateway.models import SecretSpec, SecretUpdate
from corral.gateway.secrets import SecretRecord, SecretSet, SecretVault, covers, plan_create, plan_update
from corral.proxy.policy import parse_rule

VALUE = "the-real-value-0123"


@pytest.mark.parametrize(
    ("allow", "binding", "covered"),
    [
        ("api.test", "api.test", True),
        ("api.test", "GET api.test/v1/", True),
        ("api.test", "api.test:443", True),
        ("api.test", "api.test:8443", False),
        ("api.test:8443", "api.test:8443/x", True),
        ("api.test:8443", "api.test", False),
        ("api.test", "other.test", False),
        ("api.test", "x.api.test", False),
        ("*.api.test", "x.api.test", True),
        ("*.api.test", "*.x.api.test", True),
        ("*.api.test", "*.api.test", True),
        ("*.api.test", "api.test", False),
        ("x.api.test", "*.api.test", False),
        ("GET,POST api.test", "POST api.test", True),
        ("GET api.test", "POST api.test", False),
        ("GET api.test", "api.test", False),
        ("api.test/v1/", "api.test/v1/repos", True),
        ("api.test/v1/", "api.test/v2/", False),
        ("api.test/v1/", "api.test", False),
    ],
)
def test_covers(allow: str, binding: str, covered: bool) -> None:
    assert covers([parse_rule(allow)], parse_rule(binding)) is covered
    assert covers([parse_rule("elsewhere.test"), parse_rule(allow)], parse_rule(binding)) is covered


def _spec(**fields: Any) -> SecretSpec:
    return SecretSpec.model_validate({"value": VALUE, "allow": ["api.test"], **fields})


def _update(**fields: Any) -> SecretUpdate:
    return SecretUpdate.model_validate(fields)


def test_plan_create_makes_a_placeholder_per_secret() -> None:
    planned = plan_create({"A": _spec(), "B": _spec(**{"in": ["query", "body"]})}, ["api.test"], hermetic=False)
    a, b = planned.placeholders()["A"], planned.placeholders()["B"]
    assert PLACEHOLDER.fullmatch(a) and PLACEHOLDER.fullmatch(b) and a != b
    assert planned.records["B"] == SecretRecord(placeholder=b, allow=("api.test",), locations=("query", "body"))
    assert planned.values["A"].get_secret_value() == VALUE and planned.missing_values() == []
    assert plan_create({}, [], hermetic=True) == SecretSet()


@pytest.mark.parametrize(
    ("specs", "allow", "hermetic", "field"),
    [
        ({"A": _spec(allow=["other.test"])}, ["api.test"], False, "secrets.A.allow"),
        ({"A": _spec()}, [], False, "secrets.A.allow"),
        ({"A": _spec()}, ["api.test"], True, "secrets"),
    ],
)
def test_plan_create_refuses_with_the_field(
    specs: dict[str, SecretSpec], allow: list[str], hermetic: bool, field: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan_create(specs, allow, hermetic)
    assert refused.value.field == field and VALUE not in str(refused.value)


@pytest.fixture
def current() -> SecretSet:
    return plan_create({"A": _spec(), "B": _spec()}, ["api.test"], hermetic=False)


def test_plan_update_adds_rotates_rebinds_and_revokes(current: SecretSet) -> None:
    changes = {
        "A": _update(value="rotated-value-99"),
        "B": None,
        "C": _update(value=VALUE, allow=["GET api.test/x/"]),
        "A2": _update(value=VALUE, allow=["api.test"], **{"in": ["basic"]}),
    }
    planned = plan_update(current, changes, ["api.test"], hermetic=False)
    assert planned.names == ["A", "A2", "C"]
    assert planned.records["A"] == current.records["A"]  # bindings and placeholder kept
    assert planned.values["A"].get_secret_value() == "rotated-value-99"
    assert (planned.records["C"].allow, planned.records["C"].locations) == (("GET api.test/x/",), ("header",))
    assert planned.records["A2"].locations == ("basic",)
    rebound = plan_update(planned, {"C": _update(**{"in": ["query"]})}, ["api.test"], hermetic=False)
    assert rebound.records["C"].placeholder == planned.records["C"].placeholder
    assert (rebound.records["C"].allow, rebound.records["C"].locations) == (("GET api.test/x/",), ("query",))
    assert current.names == ["A", "B"]  # the plan changed nothing it was given


@pytest.mark.parametrize(
    ("changes", "allow", "field"),
    [
        ({"Z": None}, ["api.test"], "secrets.Z"),
        ({"Z": _update(value=VALUE)}, ["api.test"], "secrets.Z"),
        ({"Z": _update(allow=["api.test"])}, ["api.test"], "secrets.Z.value"),
        ({"A": _update(allow=["x.test"])}, ["api.test"], "secrets.A.allow"),
        (None, ["x.test"], "allow"),
        ({f"N{i}": _update(value=VALUE, allow=["api.test"]) for i in range(MAX_SECRETS - 1)}, ["api.test"], "secrets"),
    ],
)
def test_plan_update_refuses_with_the_field(
    current: SecretSet, changes: dict[str, SecretUpdate | None] | None, allow: list[str], field: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan_update(current, changes, allow, hermetic=False)
    assert refused.value.field == field and VALUE not in str(refused.value)


def test_plan_update_of_a_hermetic_session_or_without_values(current: SecretSet) -> None:
    with pytest.raises(InvalidRequest) as hermetic:
        plan_update(SecretSet(), {"A": _update(value=VALUE, allow=["api.test"])}, ["api.test"], hermetic=True)
    assert hermetic.value.field == "secrets"
    adopted = SecretSet(current.records)  # after a gateway restart: records, no values
    # Only what the change names needs a value (a new secret); the others go without one.
    rotated = plan_update(adopted, {"A": _update(value=VALUE)}, ["api.test"], hermetic=False)
    assert rotated.names == ["A", "B"] and rotated.missing_values() == ["B"]
    assert plan_update(adopted, None, ["api.test", "other.test"], hermetic=False).missing_values() == ["A", "B"]
    again = plan_update(adopted, {"A": _update(value=VALUE), "B": None}, ["api.test"], hermetic=False)
    assert again.names == ["A"] and again.missing_values() == []
    with pytest.raises(InvalidRequest) as new:
        plan_update(adopted, {"C": _update(allow=["api.test"])}, ["api.test"], hermetic=False)
    assert new.value.field == "secrets.C.value"


def test_the_message_holds_the_values_and_nothing_else_shows_them(current: SecretSet) -> None:
    message = current.message("api-key:k1").to_json()  # as it goes on the wire
    assert [(e["name"], e["value"], e["in"]) for e in message["secrets"]] == [
        ("A", VALUE, ["header"]),
        ("B", VALUE, ["header"]),
    ]
    assert VALUE not in repr(current) and VALUE not in str(current) and VALUE not in repr(current.values)
    # Without the values (a restarted gateway): the entries go without one, the proxy keeps its own.
    bare = SecretSet(current.records).message("gateway:reassert").to_json()["secrets"]
    assert [sorted(entry) for entry in bare] == [["allow", "in", "name", "placeholder"]] * 2


def test_a_set_too_large_for_the_proxys_control_line_is_refused_on_secrets() -> None:
    # Each secret valid (a value of 4095 UTF-8 bytes, 16 bindings with long paths), the whole past 1 MiB.
    path = "/" + "\u00e9" * 2000
    raw = {
        f"S{i}": {"value": "\u20ac" * 1365, "allow": [f"api.test{path}{j:02d}" for j in range(16)]} for i in range(20)
    }
    with pytest.raises(InvalidRequest) as refused:
        plan_create({name: _spec(**fields) for name, fields in raw.items()}, ["api.test"], hermetic=False)
    assert refused.value.field == "secrets" and "\u20ac" * 1365 not in refused.value.message
    few = {name: _spec(**raw[name]) for name in list(raw)[:9]}  # fits once UTF-8, not once ASCII-escaped
    created = plan_create(few, ["api.test"], hermetic=False)
    more = {name: _update(**fields) for name, fields in raw.items() if name not in few}
    with pytest.raises(InvalidRequest) as grown:
        plan_update(created, more, ["api.test"], hermetic=False)
    assert grown.value.field == "secrets"


def test_the_vault_keeps_adopts_forgets_and_warns_once(current: SecretSet) -> None:
    vault = SecretVault()
    assert vault.get("s1") == SecretSet()
    vault.keep("s1", current)
    assert vault.get("s1") is current
    vault.keep("s1", SecretSet())  # all revoked
    assert vault.get("s1") == SecretSet()
    vault.adopt("s2", current.records)
    assert vault.get("s2").missing_values() == ["A", "B"]
    assert vault.first_warning("s2") is True and vault.first_warning("s2") is False
    vault.keep("s2", current)  # the owner set them again: a later loss is reported again
    assert vault.first_warning("s2") is True
    vault.forget("s2")
    assert vault.get("s2") == SecretSet()
