"""The egress manager's side of secrets: the op it sends, and the watchdog that sends the set again
to a proxy that lost it (a restart keeps names, not values), or says once that it cannot."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from corral.contracts.placeholders import value_digest
from corral.errors import EgressUnavailable
from corral.gateway.egress import REASSERT_ACTOR, Egress, EgressManager
from corral.gateway.secrets import SecretRecord, SecretSet
from corral.gateway.settings import GatewaySettings

from .proxy_fake import FakeControlProxy, ProxyState

SESSION = "ses_secrets1"
VALUE = "tok-the-real-value-42"
RECORD = SecretRecord(placeholder="corral_secret_" + "a" * 32, allow=("api.example.test",), locations=("header",))
SET = SecretSet({"API_TOKEN": RECORD}, {"API_TOKEN": SecretStr(VALUE)})
ROTATED = SecretSet({"API_TOKEN": RECORD}, {"API_TOKEN": SecretStr("tok-the-rotated-value-7")})


@pytest.fixture
async def server() -> AsyncIterator[FakeControlProxy]:
    proxy = FakeControlProxy()
    await proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
async def world(tmp_path: Path, server: FakeControlProxy) -> AsyncIterator[tuple[EgressManager, ProxyState, Egress]]:
    manager = EgressManager(GatewaySettings(data_dir=tmp_path / "data"), runtime=None)  # type: ignore[arg-type]
    manager.state_dir(SESSION).mkdir(parents=True)
    manager.record_start(SESSION, [], "enforce")
    manager.control_port = server.port
    egress = Egress(SESSION, "net", "10.9.0.0/24", "10.9.0.1", "id", "proxy", "127.0.0.1", str(tmp_path))
    yield manager, server.state(manager.token(SESSION)), egress


async def test_set_secrets_sends_the_whole_set_and_the_vault_takes_it(world) -> None:
    manager, proxy, egress = world
    reply = await manager.set_secrets(egress, SET, "api-key:k1")
    assert reply.to_json()["secrets"] == {
        "generation": 1,
        "names": ["API_TOKEN"],
        "loaded": True,
        "digests": {"API_TOKEN": value_digest(manager.token(SESSION), VALUE.encode())},
    }
    assert proxy.secrets_ops() == [
        {
            "op": "secrets",
            "actor": "api-key:k1",
            "secrets": [
                {
                    "name": "API_TOKEN",
                    "placeholder": RECORD.placeholder,
                    "value": VALUE,
                    "allow": ["api.example.test"],
                    "in": ["header"],
                }
            ],
        }
    ]
    assert manager.vault.get(SESSION) is SET
    assert await manager.check(egress) is True  # the proxy holds what the gateway set: nothing sent
    assert len(proxy.secrets_ops()) == 1


async def test_a_refused_set_leaves_the_vault_as_it_was(world, server: FakeControlProxy) -> None:
    manager, _, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    server.refuse.add("secrets")
    with pytest.raises(EgressUnavailable, match="refused secrets"):
        await manager.set_secrets(egress, SecretSet(), "api-key:k1")
    assert manager.vault.get(SESSION) is SET


async def test_the_watchdog_sends_the_set_again_to_a_restarted_proxy(world, caplog) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    proxy.restart()
    caplog.set_level(logging.DEBUG)
    assert await manager.check(egress) is False
    op = proxy.secrets_ops()[-1]
    assert op["actor"] == REASSERT_ACTOR and op["secrets"][0]["value"] == VALUE
    assert proxy.loaded is True
    assert await manager.check(egress) is True and len(proxy.secrets_ops()) == 2
    assert "sending them again" in caplog.text and VALUE not in caplog.text


async def test_the_watchdog_sends_the_set_again_when_the_names_differ(world) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    proxy.secrets.clear()  # a proxy that lost one (its state file rewritten)
    assert await manager.check(egress) is False
    assert sorted(proxy.secrets) == ["API_TOKEN"] and proxy.secrets_ops()[-1]["actor"] == REASSERT_ACTOR


async def test_after_a_gateway_restart_the_watchdog_names_the_lost_secrets_once(world, caplog) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    restarted = EgressManager(GatewaySettings(data_dir=Path(str(manager.root.parent))), runtime=None)  # type: ignore[arg-type]
    restarted.control_port = manager.control_port
    restarted.vault.adopt(SESSION, {"API_TOKEN": RECORD})  # what the session record keeps: no value
    assert await restarted.check(egress) is True  # the proxy still holds them: nothing to do, nothing said
    proxy.restart()
    caplog.set_level(logging.DEBUG)
    assert await restarted.check(egress) is True
    assert await restarted.check(egress) is True
    warnings = [r for r in caplog.records if "holds no values" in r.getMessage()]
    assert len(warnings) == 1 and "API_TOKEN" in warnings[0].getMessage()
    assert len(proxy.secrets_ops()) == 1 and VALUE not in caplog.text
    # Once the owner sets the value again, the proxy has it and the watchdog is content.
    await restarted.set_secrets(egress, SET, "api-key:k1")
    assert proxy.loaded is True and await restarted.check(egress) is True


async def test_a_proxy_from_before_secrets_is_left_alone(world, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, proxy, egress = world
    manager.vault.keep(SESSION, SET)
    current = ProxyState.answer

    def older(self: ProxyState) -> dict[str, object]:
        return {k: v for k, v in current(self).items() if k != "secrets"}

    monkeypatch.setattr(ProxyState, "answer", older)
    assert await manager.check(egress) is True
    assert proxy.secrets_ops() == []


@pytest.mark.parametrize("change", [SecretSet(), ROTATED], ids=["revoke", "rotate"])
async def test_a_set_the_proxy_took_stands_when_its_answer_is_lost(world, server, change: SecretSet) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    server.lose.add("secrets")
    await manager.set_secrets(egress, change, "api-key:k1")  # the status shows the proxy took it
    assert manager.vault.get(SESSION) == change
    server.lose.clear()
    assert await manager.check(egress) is True and len(proxy.secrets_ops()) == 2  # nothing to send again


async def test_a_rotation_the_proxy_never_took_is_told_by_its_digest(world, server) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    server.drop.add("secrets")
    with pytest.raises(EgressUnavailable):
        await manager.set_secrets(egress, ROTATED, "api-key:k1")  # same names: only the digest tells
    assert manager.vault.get(SESSION) is SET and proxy.secrets["API_TOKEN"]["value"] == VALUE


async def test_the_watchdog_sends_the_value_again_when_the_proxy_holds_another(world) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    proxy.secrets["API_TOKEN"]["value"] = "tok-someone-elses-value"  # same names, loaded, another value
    assert await manager.check(egress) is False
    assert proxy.secrets["API_TOKEN"]["value"] == VALUE and proxy.secrets_ops()[-1]["actor"] == REASSERT_ACTOR


async def test_a_reassert_the_proxy_refuses_is_an_error(world, server, caplog) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    proxy.restart()
    server.refuse.add("secrets")
    caplog.set_level(logging.DEBUG)
    await manager.watch.check_quietly(egress)
    refused = [r for r in caplog.records if "did not take its secrets again" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR


async def test_after_a_gateway_restart_a_change_sends_the_values_it_lacks_as_none(world) -> None:
    manager, proxy, egress = world
    await manager.set_secrets(egress, SET, "api-key:k1")
    restarted = EgressManager(GatewaySettings(data_dir=Path(str(manager.root.parent))), runtime=None)  # type: ignore[arg-type]
    restarted.control_port = manager.control_port
    restarted.vault.adopt(SESSION, {"API_TOKEN": RECORD})
    rebound = RECORD.model_copy(update={"allow": ("GET api.example.test/v2/",)})
    await restarted.set_secrets(egress, SecretSet({"API_TOKEN": rebound}), "api-key:k1")
    entry = proxy.secrets_ops()[-1]["secrets"][0]
    assert "value" not in entry and entry["allow"] == ["GET api.example.test/v2/"]
    assert proxy.secrets["API_TOKEN"]["value"] == VALUE and proxy.loaded  # the proxy kept its value
    assert await restarted.check(egress) is True


async def test_a_proxy_answer_of_the_wrong_shape_is_the_proxy_unusable_not_the_callers_fault(
    world, server: FakeControlProxy
) -> None:
    """A reply the typed Reply cannot read: EgressUnavailable (a cold start's wait retries it, a PATCH
    answers 503), never the caller's invalid_field."""
    manager, _, egress = world
    server.garble.add("policy")
    with pytest.raises(EgressUnavailable, match="malformed answer"):
        await manager.set_policy(egress, ["a.test"], "enforce", "api-key:k1")
