"""`corral audit show`, `summary` and `ls`, on files and against a fake gateway."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from corral.cli import app, common
from corral.errors import error_body
from corral.proxy.audit import AuditLog, verify

from .conftest import Handler

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


def _request(host: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"flow-{host}",
        "started": T0,
        "method": "GET",
        "url": f"https://{host}/?token=[redacted]",
        "scheme": "https",
        "host": host,
        "port": 443,
        "ip": "93.184.216.34",
        "sni": host,
        "http_version": "HTTP/2.0",
        "status": 200,
        "request_headers": [["Authorization", "[redacted]"]],
        "response_headers": [["Content-Type", "text/html"]],
        "mime": "text/html",
        "bytes_out": 10,
        "bytes_in": 2000,
        "duration_ms": 12.5,
        "decision": "allow",
        "rule": host,
        "reason": f"allowed by {host}",
        "action": "act_1",
        **fields,
    }


def _write(path: Path) -> list[dict[str, Any]]:
    """Record n has time T0 + n - 1."""
    log = AuditLog(path, "ses_abc")
    records: list[dict[str, Any]] = []

    def write(event: str, **fields: Any) -> None:
        records.append(log.write(event, time=T0 + len(records), **fields))

    write("proxy", version="0.1.0", mode="enforce")
    write("connect", host="example.com", port=443, client="10.0.0.2", action="act_1", decision="allow", rule="a")
    write("request", **_request("example.com"))
    write("request", **_request("api.example.com", bytes_in=500, bytes_out=0))
    write(
        "block",
        **_request(
            "example.com", method="POST", status=403, ip=None, decision="deny", rule=None, reason="[not] allowed"
        ),
    )
    write("connect", host="evil.test", port=443, client="10.0.0.2", action="act_2", decision="deny", reason="no")
    write("error", id="f", method="GET", url="https://slow.test/", host="slow.test", port=443, error="timed out")
    write("request", **_request("tracker.test", decision="report", action=None))
    write("policy", allow=["example.com"], mode="enforce", previous_allow=[], previous_mode="enforce", actor="api")
    log.close()
    return records


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    _write(path)
    return path


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output as on a wide terminal, so nothing is folded (the consoles write to the runner's streams)."""
    monkeypatch.setattr(common, "out", Console(width=250))
    monkeypatch.setattr(common, "console", Console(stderr=True, width=250))


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["audit", *args])


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


# --- show ------------------------------------------------------------------------------------------------------


def test_show_a_file_as_a_table(log_path: Path) -> None:
    result = _run("show", str(log_path))
    assert result.exit_code == 0, result.output
    for text in ("seq", "rule / reason", "api.example.com", "evil.test", "timed out", "9 of 9 records"):
        assert text in result.stdout
    assert "2024-05-01 12:00:02Z" in result.stdout  # record 3
    assert "[not] allowed" in result.stdout  # log content is not taken for rich markup
    assert "by api: mode enforce, allow example.com" in result.stdout


def test_show_json_is_the_log_itself(log_path: Path, tmp_path: Path) -> None:
    result = _run("show", str(log_path), "--json")
    assert result.exit_code == 0, result.output
    assert _json_lines(result.stdout) == [json.loads(line) for line in log_path.read_text().splitlines()]
    copy = tmp_path / "copy.jsonl"
    copy.write_text(result.stdout)
    assert verify(copy).ok


@pytest.mark.parametrize(
    ("args", "seqs"),
    [
        (["--host", "example.com"], [2, 3, 5]),
        (["--host", "*.example.com"], [4]),
        (["--decision", "deny"], [5, 6]),
        (["--decision", "report"], [8]),
        (["--event", "connect"], [2, 6]),
        (["--event", "policy"], [9]),
        (["--action", "act_2"], [6]),
        (["--since", str(T0 + 6)], [7, 8, 9]),
        (["--until", "2024-05-01T12:00:01Z"], [1, 2]),
        (["--since", "2024-05-01T14:00:02+02:00", "--until", "2024-05-01T12:00:03"], [3, 4]),
        (["--event", "request", "--decision", "allow"], [3, 4]),
        (["--host", "nowhere.test"], []),
    ],
)
def test_show_filters(log_path: Path, args: list[str], seqs: list[int]) -> None:
    result = _run("show", str(log_path), *args, "--json")
    assert result.exit_code == 0, result.output
    assert [r["seq"] for r in _json_lines(result.stdout)] == seqs


def test_show_filtered_table_counts(log_path: Path) -> None:
    result = _run("show", str(log_path), "--decision", "deny")
    assert result.exit_code == 0
    assert "2 of 9 records" in result.stdout
    assert "api.example.com" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decision", "maybe"], "decision must be one of allow, deny, report"),
        (["--event", "requests"], "event must be one of"),
        (["--since", "yesterday"], "since: not unix seconds or an ISO 8601 time"),
        (["--until", "2024-99-01"], "until: not unix seconds or an ISO 8601 time"),
        (["--since", "2024-05-02", "--until", "2024-05-01"], "is after until"),
        (["--host", "bad host"], "host: not a valid host name"),
        (["--host", "*.1.2.3.4"], "host: a wildcard needs a domain"),
    ],
)
def test_show_bad_filters_are_usage_errors(log_path: Path, args: list[str], message: str) -> None:
    result = _run("show", str(log_path), *args)
    assert result.exit_code == 2
    assert "bad filter" in result.stderr and message in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    assert "Traceback" not in result.output


def test_show_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = _run("show", str(tmp_path / "nope.jsonl"))
    assert result.exit_code == 2
    assert "no audit log at" in result.stderr


def test_show_a_malformed_log_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"seq": 1, "event": "proxy"}\n{"seq": 2,\n')
    result = _run("show", str(path))
    assert result.exit_code == 1
    assert "line 2" in result.stderr and "not valid JSON" in result.stderr
    assert "Traceback" not in result.output


# --- summary ---------------------------------------------------------------------------------------------------


def test_summary_json(log_path: Path) -> None:
    result = _run("summary", str(log_path), "--json")
    assert result.exit_code == 0, result.output
    zero = {"requests": 0, "blocked": 0, "reported": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0}
    assert json.loads(result.stdout) == {
        "hosts": [
            {**zero, "host": "api.example.com", "requests": 1, "bytes_in": 500},
            {**zero, "host": "evil.test", "blocked": 1},
            {**zero, "host": "example.com", "requests": 1, "blocked": 1, "bytes_in": 2000, "bytes_out": 10},
            {**zero, "host": "slow.test", "errors": 1},
            {**zero, "host": "tracker.test", "requests": 1, "reported": 1, "bytes_in": 2000, "bytes_out": 10},
        ],
        "total": {
            "host": "total",
            "requests": 3,
            "blocked": 2,
            "reported": 1,
            "errors": 1,
            "bytes_in": 4500,
            "bytes_out": 20,
        },
    }


def test_summary_table_has_a_total_row(log_path: Path) -> None:
    result = _run("summary", str(log_path))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for text in ("host", "requests", "blocked", "reported", "errors", "bytes in", "bytes out"):
        assert text in lines[1]
    total = next(line for line in lines if "total" in line)
    assert [cell.strip() for cell in total.split("│")[1:-1]] == ["total", "3", "2", "1", "1", "4,500", "20"]
    assert lines.index(total) > max(i for i, line in enumerate(lines) if "tracker.test" in line)


def test_summary_of_an_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text("")
    result = _run("summary", str(path), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["hosts"] == []


# --- the gateway -----------------------------------------------------------------------------------------------


LOGS = [
    {"session": "ses_live1", "state": "live", "created_at": T0, "ended_at": None, "records": 12, "bytes": 4096},
    {"session": "ses_old22", "state": "ended", "created_at": T0 - 60, "ended_at": T0 - 1, "records": 3, "bytes": 900},
]


def test_ls_against_the_gateway(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    seen = gateway(lambda request: httpx.Response(200, json=LOGS))
    result = _run("ls")
    assert result.exit_code == 0, result.output
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/v1/audit")]
    assert seen[0].headers["authorization"] == "Bearer key-1"
    row = next(line for line in result.stdout.splitlines() if "ses_old22" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        "ses_old22",
        "ended",
        "2024-05-01 11:59:00Z",
        "2024-05-01 11:59:59Z",
        "3",
        "900",
    ]
    live = next(line for line in result.stdout.splitlines() if "ses_live1" in line)
    assert [cell.strip() for cell in live.split("│")[1:-1]][3] == "-"


def test_ls_json(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(200, json=LOGS))
    result = _run("ls", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == LOGS


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (
            httpx.Response(401, json=error_body("unauthorized", "bad key")),
            "401 unauthorized: bad key",
        ),
        (httpx.Response(500, text="boom"), "500 http_error: boom"),  # the SDK's code for a body that is not JSON
        (httpx.Response(200, text="<html>"), "not JSON"),
        (httpx.Response(200, json={"logs": []}), "not a list of audit logs"),
    ],
)
def test_ls_gateway_errors_are_clean(
    gateway: Callable[[Handler], list[httpx.Request]], response: httpx.Response, message: str
) -> None:
    gateway(lambda request: response)
    result = _run("ls")
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_ls_without_a_gateway(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    gateway(refuse)
    result = _run("ls")
    assert result.exit_code == 1
    assert "no answer from the gateway on http://gateway.test" in result.stderr


def test_show_and_summary_of_a_session_fetch_its_traffic(
    gateway: Callable[[Handler], list[httpx.Request]], log_path: Path
) -> None:
    body = log_path.read_text()
    seen = gateway(lambda request: httpx.Response(200, text=body, headers={"content-type": "application/jsonl"}))
    result = _run("show", "ses_abc", "--event", "block", "--json")
    assert result.exit_code == 0, result.output
    assert [r["seq"] for r in _json_lines(result.stdout)] == [5]
    result = _run("summary", "ses_abc")
    assert result.exit_code == 0, result.output
    assert "tracker.test" in result.stdout
    assert [r.url.path for r in seen] == ["/v1/sessions/ses_abc/traffic"] * 2
    assert all(r.headers["authorization"] == "Bearer key-1" for r in seen)


def test_a_session_the_gateway_does_not_know(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(404, json=error_body("not_found", "no such session")))
    result = _run("show", "ses_nope")
    assert result.exit_code == 1
    assert "404 not_found: no such session" in result.stderr


def test_a_session_whose_traffic_is_not_a_log(gateway: Callable[[Handler], list[httpx.Request]]) -> None:
    gateway(lambda request: httpx.Response(200, text='{"seq": 1}\n<html>\n'))
    result = _run("summary", "ses_abc")
    assert result.exit_code == 1
    assert "session ses_abc: line 2: not valid JSON" in result.stderr


def test_a_file_named_like_a_session_is_read_as_a_file(
    gateway: Callable[[Handler], list[httpx.Request]], log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = gateway(lambda request: httpx.Response(500))
    monkeypatch.chdir(log_path.parent)
    log_path.rename(log_path.parent / "ses_local.jsonl")
    result = _run("show", "ses_local.jsonl", "--json")
    assert result.exit_code == 0, result.output
    assert len(_json_lines(result.stdout)) == 9
    assert seen == []


# --- verify against the gateway's anchors ----------------------------------------------------------------------

ANCHOR_KEY = b"a" * 32


def _anchored(tmp_path: Path, log_path: Path, *seqs: int) -> tuple[Path, Path]:
    """Anchors of the log's records ``seqs`` and the key file, as the gateway keeps them."""
    from corral.proxy.audit import make_anchor

    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(
        "".join(json.dumps(make_anchor(ANCHOR_KEY, "ses_abc", s, records[s - 1]["hash"], "poll")) + "\n" for s in seqs)
    )
    key = tmp_path / "key"
    key.write_bytes(ANCHOR_KEY)
    return anchors, key


def test_verify_with_anchors_proves_the_anchored_part(log_path: Path, tmp_path: Path) -> None:
    anchors, key = _anchored(tmp_path, log_path, 3, 7)
    result = _run("verify", str(log_path), "--anchors", str(anchors), "--key", str(key))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 9 records, chain intact, 2 anchors match: records 1-7")
    assert "the 2 after it are vouched for by the chain only" in result.stdout
    answer = json.loads(_run("verify", str(log_path), "--anchors", str(anchors), "--key", str(key), "--json").stdout)
    assert (answer["status"], answer["proven"], answer["unproven"], answer["mac_checked"]) == ("intact", 7, 2, True)


def test_verify_catches_a_cut_log_that_the_chain_alone_accepts(log_path: Path, tmp_path: Path) -> None:
    anchors, key = _anchored(tmp_path, log_path, 3, 9)
    log_path.write_text("".join(log_path.read_text().splitlines(keepends=True)[:6]))
    assert _run("verify", str(log_path)).exit_code == 0  # without anchors: consistent, and says only that
    assert "proves only that the log is internally consistent" in _run("verify", str(log_path)).stdout
    result = _run("verify", str(log_path), "--anchors", str(anchors), "--key", str(key))
    assert result.exit_code == 1
    assert "truncated: the gateway anchored record 9" in result.stdout and "ends at record 6" in result.stdout


def test_verify_catches_a_log_rewritten_whole(log_path: Path, tmp_path: Path) -> None:
    anchors, key = _anchored(tmp_path, log_path, 4, 9)
    log_path.unlink()
    log = AuditLog(log_path, "ses_abc")
    for i in range(9):
        log.write("request", **_request(f"innocent{i}.test"))
    log.close()
    assert verify(log_path).ok
    result = _run("verify", str(log_path), "--anchors", str(anchors), "--key", str(key))
    assert result.exit_code == 1
    assert "rewritten: record 4 is not the one the gateway anchored" in result.stdout


def test_verify_refuses_anchors_under_another_key(log_path: Path, tmp_path: Path) -> None:
    anchors, key = _anchored(tmp_path, log_path, 3)
    key.write_bytes(b"b" * 32)
    result = _run("verify", str(log_path), "--anchors", str(anchors), "--key", str(key))
    assert result.exit_code == 1
    assert "the anchors are not the gateway's" in result.stderr and "MAC does not match" in result.stderr
    unchecked = _run("verify", str(log_path), "--anchors", str(anchors))
    assert unchecked.exit_code == 0 and "MACs were not checked" in unchecked.stdout


def test_verify_a_session_fetches_its_log_and_anchors_from_the_gateway(
    gateway: Callable[[Handler], list[httpx.Request]], log_path: Path, tmp_path: Path
) -> None:
    anchors, _ = _anchored(tmp_path, log_path, 5)
    cut = "".join(log_path.read_text().splitlines(keepends=True)[:4])
    bodies = {"/v1/sessions/ses_abc/traffic": cut, "/v1/sessions/ses_abc/traffic.anchors": anchors.read_text()}
    seen = gateway(lambda request: httpx.Response(200, text=bodies[request.url.path]))
    result = _run("verify", "ses_abc")
    assert [r.url.path for r in seen] == list(bodies)
    assert result.exit_code == 1
    assert "truncated: the gateway anchored record 5" in result.stdout


# --- brokered secrets ------------------------------------------------------------------------------------------
# A log written by the chain's own writer, with hand-written records in the shapes the proxy writes.


@pytest.fixture
def secrets_log(tmp_path: Path) -> Path:
    path = tmp_path / "secrets.jsonl"
    log = AuditLog(path, "ses_sec")
    bindings = {"GITHUB_TOKEN": {"allow": ["GET,POST api.example.test/v1/"], "in": ["header"]}}
    log.write("proxy", version="0.1.0", mode="enforce")  # 1
    log.write(
        "secrets",
        actor="api-key:k1",
        generation=1,
        added=["GITHUB_TOKEN"],
        rotated=[],
        revoked=[],
        restored=[],
        bindings=bindings,
    )  # 2
    log.write("request", **_request("api.example.test", method="POST"))  # 3
    use = {"id": "f", "method": "POST", "url": "https://api.example.test/v1/x", "port": 443, "action": "act_1"}
    log.write(
        "secret",
        **use,
        host="api.example.test",
        rule="secret-substitution",
        secret="GITHUB_TOKEN",
        location="header",
        count=2,
    )  # 4
    log.write(
        "secret",
        **use,
        host="api.example.test",
        rule="secret-reflection",
        secret="GITHUB_TOKEN",
        location="response-body",
        count=1,
    )  # 5
    misuse = {
        "decision": "deny",
        "status": 403,
        "rule": "secret-misuse",
        "reason": "GITHUB_TOKEN is not bound to evil.test",
    }
    log.write(
        "block",
        **_request("evil.test", method="POST", **misuse),
        secret="GITHUB_TOKEN",
        location="body",
        exfiltration=True,
    )  # 6
    log.write("block", **_request("evil.test", decision="deny", status=403, rule="default-deny"))  # 7
    log.write(
        "block",
        **_request("api.example.test", decision="deny", status=503, rule="secret-unavailable", reason="not loaded"),
        secret="GITHUB_TOKEN",
        location="header",
    )  # 8
    log.write(
        "secrets",
        actor="api-key:k1",
        generation=2,
        added=[],
        rotated=[],
        revoked=["GITHUB_TOKEN"],
        restored=[],
        bindings={},
    )  # 9
    log.close()
    return path


def test_show_secrets_lists_only_the_records_about_secrets(secrets_log: Path) -> None:
    result = _run("show", str(secrets_log), "--secrets", "--json")
    assert result.exit_code == 0, result.output
    assert [r["seq"] for r in _json_lines(result.stdout)] == [2, 4, 5, 6, 8, 9]
    combined = _run("show", str(secrets_log), "--secrets", "--event", "block", "--json")
    assert [r["seq"] for r in _json_lines(combined.stdout)] == [6, 8]


def test_show_secrets_as_a_table_names_each_secret_and_where(secrets_log: Path) -> None:
    result = _run("show", str(secrets_log), "--secrets")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "6 of 9 records" in out
    assert "by api-key:k1: added GITHUB_TOKEN; live: GITHUB_TOKEN" in out
    assert "secret-substitution — GITHUB_TOKEN in header x2" in out
    assert "secret-reflection — GITHUB_TOKEN in response-body x1" in out
    assert "secret-misuse — GITHUB_TOKEN in body (exfiltration) — GITHUB_TOKEN is not bound to evil.test" in out
    assert "secret-unavailable — GITHUB_TOKEN in header — not loaded" in out
    assert "revoked GITHUB_TOKEN; live: none" in out
    assert "default-deny" not in out


def test_summary_has_a_secrets_section_per_host_and_secret(secrets_log: Path) -> None:
    result = _run("summary", str(secrets_log), "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    zero = {"substitutions": 0, "reflections": 0, "misuse": 0, "exfiltration": 0, "unavailable": 0}
    assert answer["secrets"] == [
        {
            **zero,
            "host": "api.example.test",
            "secret": "GITHUB_TOKEN",
            "substitutions": 2,
            "reflections": 1,
            "unavailable": 1,
        },
        {**zero, "host": "evil.test", "secret": "GITHUB_TOKEN", "misuse": 1, "exfiltration": 1},
    ]
    assert answer["total"]["blocked"] == 3  # the host table counts the same blocks as before

    table = _run("summary", str(secrets_log))
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert any("brokered secrets" in line for line in lines)
    header = next(line for line in lines if "substitutions" in line)
    for text in ("secret", "reflections scrubbed", "misuse blocks", "exfiltration", "unavailable"):
        assert text in header
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if "GITHUB_TOKEN" in line]
    assert rows == [
        ["api.example.test", "GITHUB_TOKEN", "2", "1", "0", "0", "1"],
        ["evil.test", "GITHUB_TOKEN", "0", "0", "1", "1", "0"],
    ]


def test_summary_of_a_log_without_secrets_has_no_secrets_section(log_path: Path) -> None:
    assert "secrets" not in json.loads(_run("summary", str(log_path), "--json").stdout)
    assert "brokered secrets" not in _run("summary", str(log_path)).stdout


def test_show_names_a_human_s_action_and_the_link_and_lease_records(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, "ses_abc")
    log.write(
        "connect", host="example.com", port=443, action="h1.beef", actor="human:lnk_3kq9x0a1b2c4", decision="allow"
    )
    log.write("link", link="lnk_3kq9x0a1b2c4", mode="control", change="created", actor="key-1", expires_at=T0)
    log.write("control", change="taken", holder="human:lnk_3kq9x0a1b2c4", previous="agent")
    log.close()
    result = _run("show", str(path))
    assert result.exit_code == 0, result.output
    for text in (
        "h1.beef (human:lnk_3kq9x0a1b2c4)",
        "control link lnk_3kq9x0a1b2c4 created (made by key-1)",
        "lease taken: agent -> human:lnk_3kq9x0a1b2c4",
    ):
        assert text in result.stdout
