"""Brokered secrets end to end (issue 14): the sandbox holds placeholders, the session's proxy puts
the real values in requests to bound hosts only, and nothing the agent sees or Corral writes holds
a value.

One session declares six secrets, each bound to a method, host, path prefix and location on the fake
upstream, whose ``/echo`` answers what it received (and prints it on a ``SEEN`` line: what got past
the proxy) and whose ``/reflect`` puts it in its page, as a careless site would. Commands run by
``exec`` as the agent, with the placeholders in their environment; the browser is driven by native
actions (a login form, a page that talks over a WebSocket). The secrets are changed, badly and
well, and the proxy is killed. The session then ends and every file Corral wrote is searched for
the values; last, its recorded responses are replayed hermetically. All traffic stays on this
machine (the test's own Docker networks, names under .test).

The tests share the one session and run in file order: the leak search ends it, and the hermetic
replay comes after."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import re
import secrets
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from corral.contracts.placeholders import MAX_SECRETS, MAX_VALUE_BYTES, PLACEHOLDER
from corral.proxy.audit import verify
from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .conftest import center, find_color
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway
from .test_egress import wait_for

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


ALLOW = ["allowed.test", "other.test"]  # other.test: allowed, but no secret is bound to it
# name -> (allow, in); "in" None: the default, headers only.
BINDINGS: dict[str, tuple[list[str], list[str] | None]] = {
    "BEARER_TOKEN": (["GET allowed.test/echo"], None),
    "API_KEY": (["GET,POST allowed.test/echo", "GET allowed.test/reflect"], ["query", "body"]),
    "BASIC_PASSWORD": (["GET allowed.test/echo"], ["basic"]),
    "LOGIN_PASSWORD": (["POST allowed.test/reflect"], ["body"]),
    "ROTATING_TOKEN": (["GET allowed.test/echo"], None),
    "REVOKED_TOKEN": (["GET allowed.test/echo"], None),
}
LOGIN_PAGE = "https://allowed.test/login"
PASSWORD_FIELD, SUBMIT_BUTTON = (0, 0, 255), (0, 200, 0)  # their colours on the login page
MESSAGE_FIELD = (0, 0, 255)  # the chat page's


def new_value(name: str) -> str:
    """A value with characters every encoding changes (``/ + = %``), so each form is its own."""
    return f"{name.lower()}-{secrets.token_hex(12)}/+={secrets.token_hex(4)}%{secrets.token_hex(4)}"


def leak_forms(value: str) -> set[bytes]:
    """Every form a value could be found in: plain, URL-encoded (both quotings, either case of hex),
    JSON-escaped, and base64 (standard and URL-safe) at the three alignments it can start on (the run
    of characters that depend on the value's bytes alone)."""
    raw = value.encode()
    quoted = {urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.quote_plus(value)}
    quoted |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), q) for q in quoted}
    forms = {raw, json.dumps(value)[1:-1].encode(), value.replace("/", "\\/").encode(), *(q.encode() for q in quoted)}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for shift in range(3):
            encoded = encode(b"\0" * shift + raw)
            forms.add(encoded[4 if shift else 0 : (shift + len(raw)) // 3 * 4])
    return forms


def leaks(blob: bytes, values: list[str]) -> list[str]:
    """Which values (by their first characters) ``blob`` holds in any form."""
    return [value[:12] for value in values if any(form in blob for form in leak_forms(value))]


@dataclass(frozen=True)
class Ran:
    code: int | None
    output: str
    errors: str
    action_id: str
    reply: str  # the whole reply, as the agent got it

    def __str__(self) -> str:
        return f"exit {self.code} ({self.action_id})\n{self.output}\n{self.errors}"

    @property
    def last_line(self) -> str:
        return self.output.rstrip("\n").rsplit("\n", 1)[-1]


@dataclass
class World:
    """The session that uses secrets, and everything the tests need to know about it."""

    gw: RunningGateway
    upstream: Upstream
    runtime: DockerHarness
    id: str
    token: str
    container: str
    sb: Sandbox
    created: str  # the create reply's text
    placeholders: dict[str, str]
    values: dict[str, str]  # the live value of each secret
    every_value: list[str] = field(default_factory=list)  # every value it ever had (the leak search's list)

    @property
    def proxy(self) -> str:
        return f"corral-egress-{self.id}"

    def run(self, command: str) -> Ran:
        """``command`` by ``exec`` as the agent (``bash -lc``), through the gateway's WebSocket."""
        reply = self.sb.act({"type": "exec", "command": command, "timeout_ms": 60_000})
        result = reply["result"]
        return Ran(
            result.get("exit_code"),
            result.get("stdout", ""),
            result.get("stderr", ""),
            reply["action_id"],
            json.dumps(reply),
        )

    def traffic(self) -> list[dict[str, Any]]:
        with self.gw.client() as c:
            response = c.get(f"/v1/sessions/{self.id}/traffic")
        assert response.status_code == 200, response.text
        return [json.loads(line) for line in response.text.splitlines() if line]

    def records(self, until: Callable[[list[dict[str, Any]]], bool], **fields: Any) -> list[dict[str, Any]]:
        """The audit records with ``fields``, once ``until`` holds for them (the proxy writes a record as
        it answers; the last may land just after the answer)."""

        def matching() -> list[dict[str, Any]]:
            return [r for r in self.traffic() if all(r.get(k) == v for k, v in fields.items())]

        def settled() -> list[dict[str, Any]]:
            records = matching()
            return records if until(records) else []

        return wait_for(settled) or matching()

    def seen(self, tag: str) -> list[dict[str, Any]]:
        """What reached the upstream's /echo and /reflect on paths holding ``tag``."""
        lines = self.runtime.logs(self.upstream.name, 100_000).splitlines()
        seen = [json.loads(line[5:]) for line in lines if line.startswith("SEEN ")]
        return [s for s in seen if tag in s["path"]]

    def hit(self, tag: str) -> bool:
        """Whether any request on a path holding ``tag`` reached the upstream at all."""
        return any(tag in str(hit["path"]) for hit in self.upstream.hits(self.runtime))

    def secrets_now(self) -> dict[str, str]:
        with self.gw.client() as c:
            response = c.get(f"/v1/sessions/{self.id}/secrets")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def no_value_in(self, text: str) -> None:
        assert leaks(text.encode(), self.every_value) == [], text[:2000]


def tag() -> str:
    return secrets.token_hex(6)


# -- the world -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), f"corral-egress-sec-{os.getpid()}")


@pytest.fixture(scope="module")
def gateway_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The gateway's log (it runs in this process): everything at INFO, Corral's own at DEBUG."""
    path = tmp_path_factory.mktemp("gateway-log") / "gateway.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, corral = logging.getLogger(), logging.getLogger("corral")
    levels = root.level, corral.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    corral.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(levels[0])
        corral.setLevel(levels[1])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, gateway_log: Path) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("secrets-gw"), f"secrets-{os.getpid()}") as running:
        yield running


def declaration(values: dict[str, str]) -> dict[str, Any]:
    declared: dict[str, Any] = {}
    for name, (allow, where) in BINDINGS.items():
        declared[name] = {"value": values[name], "allow": allow} | ({} if where is None else {"in": where})
    return declared


@pytest.fixture(scope="module")
def world(gw: RunningGateway, upstream: Upstream, runtime: DockerHarness) -> Iterator[World]:
    values = {name: new_value(name) for name in BINDINGS}
    with gw.client() as c:
        response = c.post("/v1/sessions", json={"allow": ALLOW, "secrets": declaration(values)})
    assert response.status_code == 201, response.text
    info = response.json()
    sb = Sandbox.attach(info["id"], info["token"], url=gw.url)
    world = World(
        gw,
        upstream,
        runtime,
        info["id"],
        info["token"],
        info["container"],
        sb,
        response.text,
        dict(info.get("secrets") or {}),
        values,
        list(values.values()),
    )
    try:
        yield world
    finally:
        sb.close()
        with gw.client() as c:
            c.delete(f"/v1/sessions/{world.id}")


# -- what the agent holds --------------------------------------------------------------------------


def test_the_agent_holds_placeholders_only(world: World) -> None:
    placeholders = world.placeholders
    assert set(placeholders) == set(BINDINGS), world.created
    assert all(PLACEHOLDER.fullmatch(p) for p in placeholders.values()) and len(set(placeholders.values())) == 6
    world.no_value_in(world.created)
    assert world.secrets_now() == placeholders
    with world.gw.client(world.token) as agent:  # the session's token reads them too
        response = agent.get(f"/v1/sessions/{world.id}/secrets")
        assert (response.status_code, response.json()) == (200, placeholders)
        world.no_value_in(agent.get(f"/v1/sessions/{world.id}").text)
    native = world.sb.act({"type": "secrets"})
    assert native["result"]["secrets"] == placeholders
    env = world.run("env")
    assert env.code == 0, str(env)
    assert {f"{name}={placeholder}" for name, placeholder in placeholders.items()} <= set(env.output.splitlines())
    world.no_value_in(env.reply)
    # The declaration is in the audit chain: who, which names, their bindings; no value.
    (declared,) = world.records(bool, event="secrets")
    assert declared["actor"].startswith("api-key:") and set(declared["added"]) == set(BINDINGS), declared
    assert {name: (b["allow"], b["in"]) for name, b in declared["bindings"].items()} == {
        name: (allow, where or ["header"]) for name, (allow, where) in BINDINGS.items()
    }, declared


# -- substitution ----------------------------------------------------------------------------------


def _form(seen: dict[str, Any]) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(seen["body"])


SUBSTITUTIONS: dict[str, tuple[str, str, str, Callable[[dict[str, Any], str], bool]]] = {
    # case: (secret, location, curl's arguments, what the upstream must have received)
    "bearer": (
        "BEARER_TOKEN",
        "header",
        '-H "Authorization: Bearer $BEARER_TOKEN" "https://allowed.test/echo/{tag}"',
        lambda seen, value: seen["headers"]["authorization"] == f"Bearer {value}",
    ),
    "query": (
        "API_KEY",
        "query",
        '"https://allowed.test/echo/{tag}?key=$API_KEY&page=2"',
        lambda seen, value: seen["query"] == {"key": [value], "page": ["2"]},
    ),
    "form": (
        "API_KEY",
        "body",
        '--data-urlencode "key=$API_KEY" --data-urlencode "page=2" "https://allowed.test/echo/{tag}"',
        lambda seen, value: seen["method"] == "POST" and _form(seen) == {"key": [value], "page": ["2"]},
    ),
    "json": (
        "API_KEY",
        "body",
        """-H 'content-type: application/json' --data '{{"key": "'"$API_KEY"'", "page": 2}}'"""
        ' "https://allowed.test/echo/{tag}"',
        lambda seen, value: json.loads(seen["body"]) == {"key": value, "page": 2},
    ),
    "multipart": (
        "API_KEY",
        "body",
        '-F "key=$API_KEY" -F "page=2" "https://allowed.test/echo/{tag}"',
        lambda seen, value: f'name="key"\r\n\r\n{value}\r\n' in seen["body"],
    ),
    "gzip": (  # a compressed JSON body, and a compressed answer
        "API_KEY",
        "body",
        """--compressed -H 'content-type: application/json' -H 'content-encoding: gzip' --data-binary @-"""
        ' "https://allowed.test/echo/{tag}"',
        lambda seen, value: json.loads(seen["body"]) == {"key": value, "page": 2},
    ),
    "basic": (
        "BASIC_PASSWORD",
        "basic",
        '-u "agent:$BASIC_PASSWORD" "https://allowed.test/echo/{tag}"',
        lambda seen, value: (
            seen["headers"]["authorization"] == "Basic " + base64.b64encode(f"agent:{value}".encode()).decode()
        ),
    ),
}


@pytest.mark.parametrize("case", list(SUBSTITUTIONS))
def test_a_placeholder_is_replaced_by_the_value_where_its_secret_is_bound(world: World, case: str) -> None:
    name, location, arguments, received = SUBSTITUTIONS[case]
    value, placeholder, marker = world.values[name], world.placeholders[name], tag()
    body = """printf '{"key": "%s", "page": 2}' "$API_KEY" | gzip -c | """ if case == "gzip" else ""
    ran = world.run(body + "curl -sS --fail --max-time 20 " + arguments.format(tag=marker))
    assert ran.code == 0, str(ran)
    (seen,) = world.seen(marker)
    assert received(seen, value), seen  # the upstream got the real value...
    assert placeholder not in json.dumps(seen)
    # ...and its echo of it (plain, URL-encoded, base64, in headers and body) reached the agent as the placeholder.
    assert placeholder in ran.output
    world.no_value_in(ran.reply)

    def used(records: list[dict[str, Any]]) -> bool:
        return {r["rule"] for r in records} >= {"secret-substitution", "secret-reflection"}

    uses = world.records(used, event="secret", action=ran.action_id, secret=name)
    substituted = [r for r in uses if r["rule"] == "secret-substitution"]
    assert [(r["location"], r["host"], r["port"]) for r in substituted] == [(location, "allowed.test", 443)], uses
    assert substituted[0]["count"] >= 1 and substituted[0]["url"].startswith(f"https://allowed.test/echo/{marker}")
    scrubbed = {r["location"] for r in uses if r["rule"] == "secret-reflection"}
    assert "response-body" in scrubbed, uses
    if case in ("bearer", "basic"):
        assert "response-header" in scrubbed, uses  # x-echo-authorization
    (request,) = world.records(bool, event="request", action=ran.action_id)
    assert request["status"] == 200 and request["decision"] == "allow"


# -- misuse ----------------------------------------------------------------------------------------

MISUSES: dict[str, tuple[str, str]] = {
    # case: (curl's arguments, where the placeholder was)
    "host": ('-H "Authorization: Bearer $BEARER_TOKEN" "https://other.test/echo/{tag}"', "header"),
    "method": ('-X POST -H "Authorization: Bearer $BEARER_TOKEN" "https://allowed.test/echo/{tag}"', "header"),
    "path": ('-H "Authorization: Bearer $BEARER_TOKEN" "https://allowed.test/json/{tag}"', "header"),
    "location": ('"https://allowed.test/echo/{tag}?token=$BEARER_TOKEN"', "query"),
}
STATUS_AND_RULE = "-w '\\n%{http_code} %header{x-corral-rule}'"


def assert_refused_as_misuse(world: World, record: dict[str, Any], name: str, location: str) -> None:
    assert (record["event"], record["status"], record["rule"], record["decision"]) == (
        "block",
        403,
        "secret-misuse",
        "deny",
    ), record
    assert (record["secret"], record["location"], record["exfiltration"]) == (name, location, True), record


@pytest.mark.parametrize("case", list(MISUSES))
def test_a_placeholder_headed_where_its_secret_is_not_bound_is_refused_and_flagged(world: World, case: str) -> None:
    arguments, location = MISUSES[case]
    marker = tag()
    ran = world.run(f"curl -sS --max-time 20 {STATUS_AND_RULE} " + arguments.format(tag=marker))
    assert ran.code == 0, str(ran)
    assert ran.last_line == "403 secret-misuse", str(ran)
    assert "BEARER_TOKEN" in ran.output  # the refusal names the secret
    world.no_value_in(ran.reply)
    assert not world.hit(marker)  # never sent on
    (block,) = world.records(bool, event="block", action=ran.action_id)
    assert_refused_as_misuse(world, block, "BEARER_TOKEN", location)
    assert not [r for r in world.traffic() if r["event"] == "secret" and r.get("action") == ran.action_id]


def test_a_real_value_from_inside_is_refused_like_misuse(world: World) -> None:
    # The one way a value gets into the sandbox: docker exec, behind Corral's back (so nothing of
    # Corral's records the command). Sent exactly where its secret is bound, it is still refused.
    marker = tag()
    command = [
        "curl",
        "-sS",
        "--max-time",
        "20",
        "--proxy",
        "http://corral-proxy:8080",
        "--cacert",
        "/run/corral/session-ca.pem",
        "-w",
        "\n%{http_code} %header{x-corral-rule}",
        "-H",
        f"Authorization: Bearer {world.values['BEARER_TOKEN']}",
        f"https://allowed.test/echo/{marker}",
    ]
    code, output = world.runtime.exec(world.container, command, user="agent")
    assert code == 0, output
    assert output.rstrip("\n").rsplit("\n", 1)[-1] == "403 secret-misuse", output
    assert "BEARER_TOKEN" in output
    assert not world.hit(marker)

    def refused(records: list[dict[str, Any]]) -> bool:
        return any(str(r.get("url", "")).startswith(f"https://allowed.test/echo/{marker}") for r in records)

    blocks = world.records(refused, event="block", rule="secret-misuse")
    (block,) = [r for r in blocks if str(r["url"]).startswith(f"https://allowed.test/echo/{marker}")]
    assert_refused_as_misuse(world, block, "BEARER_TOKEN", "header")


def test_a_placeholder_in_a_websocket_message_is_refused_and_flagged(world: World) -> None:
    marker, sb = tag(), world.sb
    sb.navigate(f"https://allowed.test/chat/{marker}")  # a page that talks to its site over a WebSocket
    assert _title(sb, lambda t: t.startswith("heard")) == "heard hello"  # the socket works
    (field,) = _on_screen(sb, MESSAGE_FIELD)
    sb.click(*field)
    sb.type(world.placeholders["BEARER_TOKEN"])
    sb.key("Return")
    assert _title(sb, lambda t: "sent" in t).endswith("sent 46; heard hello")  # the page sent it

    def refused(records: list[dict[str, Any]]) -> bool:
        return any(r.get("location") == "websocket" for r in records)

    blocks = [r for r in world.records(refused, event="block") if r.get("location") == "websocket"]
    assert len(blocks) == 1 and blocks[0]["url"] == f"https://allowed.test/ws/{marker}", blocks
    assert (blocks[0]["rule"], blocks[0]["secret"], blocks[0]["exfiltration"]) == (
        "secret-misuse",
        "BEARER_TOKEN",
        True,
    )
    lines = world.runtime.logs(world.upstream.name, 100_000).splitlines()
    messages = [json.loads(line[3:]) for line in lines if line.startswith("WS ")]
    assert [m["text"] for m in messages if marker in m["path"]] == ["hello"], messages  # the site never heard it
    # The flow is killed: the page sees its socket closed, having heard nothing more.
    assert _title(sb, lambda t: t.startswith("closed"), timeout_s=10) == "closed; sent 46; heard hello"


# -- reflection ------------------------------------------------------------------------------------


def test_a_reflected_value_reaches_the_sandbox_as_the_placeholder(world: World) -> None:
    marker, value, placeholder = tag(), world.values["API_KEY"], world.placeholders["API_KEY"]
    ran = world.run(f'curl -sS --fail --max-time 20 "https://allowed.test/reflect/{marker}?q=$API_KEY"')
    assert ran.code == 0, str(ran)
    (seen,) = world.seen(marker)
    assert seen["query"] == {"q": [value]}
    # The page put the value in its title (plain) and the raw query (URL-encoded): both came back as the placeholder.
    assert f"<title>reflected q={placeholder}</title>" in ran.output, ran.output
    assert f"<p id=query>q={placeholder}</p>" in ran.output, ran.output
    world.no_value_in(ran.reply)

    def reflected(records: list[dict[str, Any]]) -> bool:
        return any(r["rule"] == "secret-reflection" for r in records)

    uses = world.records(reflected, event="secret", action=ran.action_id, secret="API_KEY")
    assert {(r["rule"], r["location"]) for r in uses} == {
        ("secret-substitution", "query"),
        ("secret-reflection", "response-body"),
    }, uses
    scrub = next(r for r in uses if r["rule"] == "secret-reflection")
    assert scrub["count"] >= 2 and scrub["host"] == "allowed.test", scrub


# -- changes ---------------------------------------------------------------------------------------


def test_rotation_and_revocation_are_live_on_the_next_request(world: World) -> None:
    def echoed(name_or_placeholder: str) -> tuple[Ran, list[dict[str, Any]]]:
        marker = tag()
        ran = world.run(
            f'curl -sS --max-time 20 {STATUS_AND_RULE} -H "Authorization: Bearer {name_or_placeholder}"'
            f' "https://allowed.test/echo/{marker}"'
        )
        return ran, world.seen(marker)

    before, (seen,) = echoed("$ROTATING_TOKEN")
    assert seen["headers"]["authorization"] == f"Bearer {world.values['ROTATING_TOKEN']}", str(before)
    rotated, added = new_value("ROTATING_TOKEN"), new_value("ADDED_TOKEN")
    world.every_value += [rotated, added]
    change = {
        "ROTATING_TOKEN": {"value": rotated},
        "REVOKED_TOKEN": None,
        "ADDED_TOKEN": {"value": added, "allow": ["GET allowed.test/echo"]},
    }
    with world.gw.client() as c:
        patched = c.patch(f"/v1/sessions/{world.id}", json={"secrets": change})
    assert patched.status_code == 200, patched.text
    world.no_value_in(patched.text)
    world.values.update(ROTATING_TOKEN=rotated, ADDED_TOKEN=added)
    now = world.secrets_now()
    assert set(now) == set(BINDINGS) - {"REVOKED_TOKEN"} | {"ADDED_TOKEN"}, now
    assert now["ROTATING_TOKEN"] == world.placeholders["ROTATING_TOKEN"]  # a rotation keeps the placeholder
    assert PLACEHOLDER.fullmatch(now["ADDED_TOKEN"]) and now["ADDED_TOKEN"] not in world.placeholders.values()
    world.placeholders["ADDED_TOKEN"] = now["ADDED_TOKEN"]
    assert world.sb.act({"type": "secrets"})["result"]["secrets"] == now

    after, (seen,) = echoed("$ROTATING_TOKEN")  # the next request: the new value
    assert seen["headers"]["authorization"] == f"Bearer {rotated}", str(after)
    fresh, (seen,) = echoed("$ADDED_TOKEN")
    assert seen["headers"]["authorization"] == f"Bearer {added}", str(fresh)
    env = world.run("env")
    assert f"ADDED_TOKEN={now['ADDED_TOKEN']}" in env.output.splitlines()
    assert "REVOKED_TOKEN=" not in env.output
    revoked, nothing = echoed(world.placeholders["REVOKED_TOKEN"])  # an agent that kept it
    assert revoked.last_line == "403 secret-misuse" and nothing == [], str(revoked)
    (block,) = world.records(bool, event="block", action=revoked.action_id)
    assert_refused_as_misuse(world, block, "REVOKED_TOKEN", "header")
    for ran in (before, after, fresh, revoked, env):
        world.no_value_in(ran.reply)

    changes = world.records(lambda records: any(r.get("revoked") for r in records), event="secrets")
    (record,) = [r for r in changes if r.get("revoked")]
    assert (record["added"], record["rotated"], record["revoked"]) == (
        ["ADDED_TOKEN"],
        ["ROTATING_TOKEN"],
        ["REVOKED_TOKEN"],
    ), record
    assert record["actor"].startswith("api-key:")
    assert set(record["bindings"]) == set(now) and record["bindings"]["ADDED_TOKEN"]["allow"] == [
        "GET allowed.test/echo"
    ]


# -- bad input -------------------------------------------------------------------------------------


def _bad_patches(good: str) -> list[tuple[dict[str, Any], str]]:
    """(PATCH body, the field its 422 names); each would change something were it whole."""
    new = {"value": good, "allow": ["GET allowed.test/echo"]}
    return [
        ({"secrets": {"NO_SUCH_SECRET": None}}, "secrets.NO_SUCH_SECRET"),  # revoke an unknown name
        ({"secrets": {"NO_SUCH_SECRET": {"value": good}}}, "secrets.NO_SUCH_SECRET"),  # rotate one
        ({"secrets": {"BEARER_TOKEN": {"value": "v" * (MAX_VALUE_BYTES + 1)}}}, "secrets.BEARER_TOKEN.value"),
        ({"secrets": {"NEW_TOKEN": {**new, "allow": ["*.*.test"]}}}, "secrets.NEW_TOKEN.allow"),  # not the grammar
        ({"secrets": {"NEW_TOKEN": {**new, "allow": ["GET elsewhere.test/"]}}}, "secrets.NEW_TOKEN.allow"),
        ({"secrets": {"NEW_TOKEN": {**new, "allow": ["GET allowed.test:8443/echo"]}}}, "secrets.NEW_TOKEN.allow"),
        ({"secrets": {"PATH": new}}, "secrets.PATH"),  # a name commands' environments use
        ({"secrets": {f"EXTRA_{i}": new for i in range(MAX_SECRETS)}}, "secrets"),  # past the cap
        # A good change beside a bad one: neither is made, nor the allowlist change with them.
        (
            {
                "allow": [*ALLOW, "api.allowed.test"],
                "secrets": {"NEW_TOKEN": new, "BAD_TOKEN": {**new, "value": "short"}},
            },
            "secrets.BAD_TOKEN.value",
        ),
    ]


def test_bad_input_is_refused_whole_with_the_field(world: World) -> None:
    good = new_value("NEW_TOKEN")
    world.every_value.append(good)
    before = world.secrets_now()
    changes = len([r for r in world.traffic() if r["event"] in ("secrets", "policy")])
    with world.gw.client() as c:
        for body, field_name in _bad_patches(good):
            response = c.patch(f"/v1/sessions/{world.id}", json=body)
            assert response.status_code == 422, (body.keys(), response.text)
            error = response.json()["error"]
            assert error["field"] == field_name or error["field"].startswith(field_name + "."), (field_name, error)
            world.no_value_in(response.text)
        assert c.get(f"/v1/sessions/{world.id}").json()["allow"] == ALLOW
        # The agent's token may read its placeholders, never change them.
        with world.gw.client(world.token) as agent:
            denied = agent.patch(f"/v1/sessions/{world.id}", json={"secrets": {"BEARER_TOKEN": None}})
        assert denied.status_code == 403, denied.text
    assert world.secrets_now() == before
    assert len([r for r in world.traffic() if r["event"] in ("secrets", "policy")]) == changes  # the proxy untouched
    ran = world.run(
        'curl -sS --fail --max-time 20 -H "Authorization: Bearer $BEARER_TOKEN" https://allowed.test/echo/x'
    )
    assert ran.code == 0, str(ran)


def test_a_bad_declaration_makes_no_session(gw: RunningGateway) -> None:
    good = new_value("TOKEN")
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"allow": ["allowed.test"], "secrets": {"TOKEN": {"value": good, "allow": ["other.test"]}}},
            "secrets.TOKEN.allow",
        ),
        (
            {"allow": ["allowed.test"], "secrets": {"TOKEN": {"value": good, "allow": ["allowed.test"], "in": []}}},
            "secrets.TOKEN",
        ),
        (
            {
                "allow": ["allowed.test"],
                "secrets": {f"T{i}": {"value": good, "allow": ["allowed.test"]} for i in range(MAX_SECRETS + 1)},
            },
            "secrets",
        ),
    ]
    with gw.client() as c:
        sessions = c.get("/v1/sessions").json()
        for body, field_name in cases:
            response = c.post("/v1/sessions", json=body)
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["field"] == field_name or error["field"].startswith(field_name + "."), (field_name, error)
            assert leaks(response.content, [good]) == []
        assert c.get("/v1/sessions").json() == sessions


# -- the computer-use case -------------------------------------------------------------------------


def _on_screen(sb: Sandbox, *colours: tuple[int, int, int]) -> list[tuple[int, int]]:
    """The centres of the fields of ``colours``, once the page shows them all (the first frame of a
    new document can lag its load)."""

    def shown() -> Image.Image | None:
        screen = Image.open(io.BytesIO(sb.screenshot())).convert("RGB")
        return screen if all(_has(screen, colour) for colour in colours) else None

    screen = wait_for(shown, timeout_s=15, interval_s=0.2)
    assert screen is not None, f"{colours} never showed"
    return [center(find_color(screen, colour)) for colour in colours]


def _has(screen: Image.Image, colour: tuple[int, int, int]) -> bool:
    """Whether a good patch of the screen (a field, not a stray pixel) is exactly ``colour``."""
    return any(count >= 400 and found == colour for count, found in screen.getcolors(1 << 24) or [])


def _title(sb: Sandbox, until: Callable[[str], bool], timeout_s: float = 20.0) -> str:
    return wait_for(lambda: t if until(t := str(sb.page_info().title)) else "", timeout_s) or str(sb.page_info().title)


def log_in(sb: Sandbox, placeholder: str) -> str:
    """What an agent does: open the login page, click the password field, type, click the button;
    returns the title of the page shown after."""
    sb.navigate(LOGIN_PAGE)
    assert _title(sb, lambda t: t == "login") == "login"
    field, button = _on_screen(sb, PASSWORD_FIELD, SUBMIT_BUTTON)
    sb.click(*field)
    sb.type(placeholder)
    sb.click(*button)
    return _title(sb, lambda t: t.startswith("reflected"))


def test_the_agent_logs_in_with_a_placeholder_and_never_sees_the_value(world: World) -> None:
    placeholder = world.sb.act({"type": "secrets"})["result"]["secrets"]["LOGIN_PASSWORD"]  # as the agent learns it
    assert placeholder == world.placeholders["LOGIN_PASSWORD"]
    before = len(world.seen("/reflect"))
    shown = log_in(world.sb, placeholder)
    # The page after login shows what the site received: the placeholder, never the value.
    assert shown == f"reflected password={placeholder}", shown
    world.no_value_in(shown)
    posts = [s for s in world.seen("/reflect")[before:] if s["method"] == "POST"]
    assert [_form(s) for s in posts] == [{"password": [world.values["LOGIN_PASSWORD"]]}], posts

    def both(records: list[dict[str, Any]]) -> bool:
        return {r["rule"] for r in records} >= {"secret-substitution", "secret-reflection"}

    uses = world.records(both, event="secret", secret="LOGIN_PASSWORD")
    substituted = [r for r in uses if r["rule"] == "secret-substitution"]
    assert [(r["location"], r["host"], r["method"], r["url"]) for r in substituted] == [
        ("body", "allowed.test", "POST", "https://allowed.test/reflect")
    ], uses
    assert {r["location"] for r in uses if r["rule"] == "secret-reflection"} == {"response-body"}, uses


# -- the proxy restarts ----------------------------------------------------------------------------


def test_a_restarted_proxy_gets_the_values_again(world: World) -> None:
    world.sb.navigate(LOGIN_PAGE)  # the agent's browser in use: the controller's channel to the proxy is open
    # What the proxy recorded so far is on disk before it is killed (it writes its recorded responses
    # out every second, in order): the leak search and the hermetic replay read them.
    marker, responses = tag(), world.gw.settings.data_dir / "egress" / world.id / "responses.mitm"
    assert world.run(f"curl -sS --fail https://allowed.test/json/{marker}").code == 0
    assert wait_for(lambda: marker.encode() in responses.read_bytes()), "the recorded responses were not written"
    world.runtime.kill(world.proxy)  # SIGKILL: the proxy's memory, values and all, is gone

    def substituted() -> Ran | None:
        marker = tag()
        ran = world.run(
            f'curl -sS --max-time 5 -H "Authorization: Bearer $BEARER_TOKEN" "https://allowed.test/echo/{marker}"'
        )
        seen = world.seen(marker)
        ok = seen and seen[0]["headers"]["authorization"] == f"Bearer {world.values['BEARER_TOKEN']}"
        return ran if ok else None

    ran = wait_for(substituted, timeout_s=60, interval_s=0.5)
    assert ran is not None, "a restarted proxy never substituted again"
    world.no_value_in(ran.reply)

    def restored(records: list[dict[str, Any]]) -> bool:
        return any(r["actor"] == "gateway:reassert" and r.get("restored") for r in records)

    records = [r for r in world.records(restored, event="secrets") if r["actor"] == "gateway:reassert"]
    assert records and set(records[-1]["restored"]) == set(world.secrets_now()), records
    # The agent's native actions go on too, through the restarted proxy.
    world.sb.navigate(f"https://allowed.test/reflect/{tag()}")
    assert _title(world.sb, lambda t: t.startswith("reflected")).startswith("reflected")


# -- after the session: the leak search and the hermetic replay ------------------------------------


@dataclass
class Finished:
    id: str
    container: str  # the sandbox's
    bundle: Path  # the recording bundle, unpacked
    captured: dict[str, bytes]  # what Docker kept of the session's containers, and the gateway's answers
    every_value: list[str]
    placeholders: dict[str, str]


@pytest.fixture(scope="module")
def finished(world: World, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The session ended: its containers' logs and configuration taken first (Docker drops them with
    the containers), then its bundle and HAR fetched."""
    runtime, data_dir = world.runtime, world.gw.settings.data_dir
    # The live state too: the session's record (the store drops it at the end) and the proxy's files.
    captured = {f"live {name}": data for name, data in _contents(data_dir)}
    for name in (world.container, world.proxy):
        captured[f"docker logs {name}"] = runtime.logs(name, 1_000_000).encode()
        container = runtime.client.containers.get(name)
        captured[f"docker inspect {name}"] = json.dumps(container.attrs).encode()
    world.sb.close()
    with world.gw.client() as c:
        assert c.delete(f"/v1/sessions/{world.id}").status_code == 204
        target = tmp_path_factory.mktemp("bundle")
        bundle = c.get(f"/v1/sessions/{world.id}/recording")
        assert bundle.status_code == 200, bundle.text
        (target / "bundle.zip").write_bytes(bundle.content)
        for path in ("traffic.har", "traffic.anchors", "traffic"):
            captured[f"GET {path}"] = c.get(f"/v1/sessions/{world.id}/{path}").content
        captured["GET /v1/audit"] = c.get("/v1/audit").content
        captured["GET /v1/recordings"] = c.get("/v1/recordings").content
    with zipfile.ZipFile(target / "bundle.zip") as archive:
        archive.extractall(target)
    return Finished(
        world.id, world.container, target / world.id, captured, list(world.every_value), dict(world.placeholders)
    )


def _contents(path: Path) -> Iterator[tuple[str, bytes]]:
    """Every file under ``path``, and what is inside the archives among them (zip, gzip)."""
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
        data = file.read_bytes()
        yield str(file), data
        yield from _unpacked(str(file), data)


def _unpacked(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """What is inside ``data``: a zip's members, and every gzip stream in it (a whole file, or a
    compressed body inside a flow file)."""
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for member in archive.namelist():
                yield f"{name}!{member}", archive.read(member)
    for start in (m.start() for m in re.finditer(b"\x1f\x8b\x08", data)):
        with contextlib.suppress(zlib.error):
            yield f"{name}!gunzip@{start}", zlib.decompressobj(wbits=31).decompress(data[start:])


def test_nothing_corral_wrote_holds_a_value(
    finished: Finished, gw: RunningGateway, gateway_log: Path, upstream: Upstream, runtime: DockerHarness
) -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    searched: dict[str, bytes] = dict(_contents(gw.settings.data_dir))
    searched.update(_contents(finished.bundle.parent))
    searched[str(gateway_log)] = gateway_log.read_bytes()
    for name, data in finished.captured.items():
        searched[name] = data
        searched.update(_unpacked(name, data))
    found = {name: leaks(data, finished.every_value) for name, data in searched.items()}
    assert {name: values for name, values in found.items() if values} == {}
    # The search sees a value where there is one: the upstream (not Corral) logged what it received.
    upstream_log = runtime.logs(upstream.name, 100_000).encode()
    assert leaks(upstream_log, finished.every_value), "the search cannot see values"
    # The search looked where the secrets went: the recorded responses hold the login's request with
    # its placeholder, the audit log its uses (proof they were read, and that they record the traffic).
    egress = gw.settings.data_dir / "egress" / finished.id
    recorded = [
        finished.bundle / "responses.mitm",
        gw.settings.data_dir / "recordings" / finished.id / "responses.mitm",
    ]
    for name in map(str, recorded):
        assert finished.placeholders["LOGIN_PASSWORD"].encode() in searched[name], name
    assert b'"secret":"LOGIN_PASSWORD"' in searched[str(egress / "audit.jsonl")]
    assert verify(egress / "audit.jsonl").ok  # every use and change of a secret is in an unbroken chain
    events = finished.bundle / "events.jsonl"
    assert finished.placeholders["LOGIN_PASSWORD"].encode() in searched[str(events)]  # the typed text
    assert b"$BEARER_TOKEN" in searched[str(events)]  # the commands, as given
    assert searched[f"docker logs corral-egress-{finished.id}"] and searched[f"docker logs {finished.container}"]
    assert finished.id.encode() in searched[str(gateway_log)]  # the gateway logged about the session
    assert any(name.startswith(f"live {gw.settings.data_dir / 'sessions'}") for name in searched)
    assert f"live {egress / 'policy.json'}" in searched


def test_a_hermetic_replay_of_the_session_works_with_placeholders(
    finished: Finished, gw: RunningGateway, upstream: Upstream, runtime: DockerHarness
) -> None:
    responses = read_bundle(finished.bundle).responses
    assert responses is not None and finished.placeholders["LOGIN_PASSWORD"].encode() in responses
    good = new_value("TOKEN")
    secret = {"TOKEN": {"value": good, "allow": ["allowed.test"]}}
    with gw.client() as c:
        sessions = c.get("/v1/sessions").json()
        upload = c.post("/v1/replay-responses", content=responses)
        assert upload.status_code == 201, upload.text
        refused = c.post("/v1/sessions", json={"hermetic": upload.json()["id"], "allow": ALLOW, "secrets": secret})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "secrets", refused.text
        assert leaks(refused.content, [good]) == []
        assert c.get("/v1/sessions").json() == sessions
        c.delete(f"/v1/replay-responses/{upload.json()['id']}")
    before = len(upstream.hits(runtime))
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=ALLOW, hermetic_responses=responses) as sb:
        with gw.client() as c:
            patched = c.patch(f"/v1/sessions/{sb.id}", json={"secrets": secret})
            assert patched.status_code == 422 and patched.json()["error"]["field"] == "secrets", patched.text
        # The recording's agent typed the old session's placeholder: the replay types it again, and the
        # recorded answer (which holds the placeholder, never the value) comes back.
        placeholder = finished.placeholders["LOGIN_PASSWORD"]
        assert log_in(sb, placeholder) == f"reflected password={placeholder}"
        records = sb.traffic()
    post = next(r for r in records if r.event == "request" and r.url == "https://allowed.test/reflect")
    assert (post.method, post.status, post.get("replayed")) == ("POST", 200, True), post
    assert not [r for r in records if r.event == "secret"]
    assert len(upstream.hits(runtime)) == before  # answered from the recording alone
