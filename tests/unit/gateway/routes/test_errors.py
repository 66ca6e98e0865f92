"""The one table from exceptions to HTTP answers, and the one error body."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI

from corral import errors
from corral.errors import CodedError, ErrorCode, error_body
from corral.gateway.metrics import Metrics
from corral.gateway.routes.errors import STATUS, answer_for, install, public_error
from corral.protocol.reply import failure

from .conftest import client_for

EXPECTED = {
    errors.InvalidCursor: (400, "invalid_request"),
    errors.Unauthorized: (401, "unauthorized"),
    errors.Forbidden: (403, "forbidden"),
    errors.NotFound: (404, "not_found"),
    errors.SessionNotFound: (404, "not_found"),
    errors.ReplayNotFound: (404, "not_found"),
    errors.HermeticUnavailable: (409, "egress_off"),
    errors.MessageTooLarge: (413, "message_too_large"),
    errors.UploadTooLarge: (413, "too_large"),
    errors.InvalidRequest: (422, "invalid_request"),
    errors.ReplayUnreadable: (422, "replay_unreadable"),
    errors.CapacityError: (429, "too_many_sessions"),
    errors.AuditLogUnreadable: (500, "audit_log_unreadable"),
    errors.AuditAnchorsInvalid: (500, "audit_anchors_invalid"),
    errors.SandboxUnreachable: (502, "sandbox_unreachable"),
    errors.UnprovenController: (502, "controller_unproven"),
    errors.EgressUnavailable: (503, "egress_unavailable"),
    errors.SandboxStartFailed: (503, "sandbox_start_failed"),
    errors.SandboxError: (500, "internal"),
    errors.BundleError: (500, "bundle_unreadable"),
    errors.InvalidPath: (400, "invalid_field"),
    errors.FileAccessDenied: (403, "permission_denied"),
    errors.NoSuchFile: (404, "no_such_file"),
    errors.NotADirectory: (409, "not_a_directory"),
    errors.IsADirectory: (409, "is_a_directory"),
    errors.FileRefused: (500, "file_failed"),
    errors.NoSpace: (507, "no_space"),
}


@pytest.mark.parametrize(("cls", "expected"), EXPECTED.items(), ids=lambda v: getattr(v, "__name__", ""))
def test_each_error_has_its_status_and_code(cls: type[CodedError], expected: tuple[int, str]) -> None:
    exc = cls("what happened")
    assert (answer_for(exc).status, str(exc.code)) == expected


def test_every_row_of_the_table_is_a_coded_error_with_a_code() -> None:
    for cls in STATUS:
        assert issubclass(cls, CodedError) and isinstance(cls.code, ErrorCode)


def test_a_start_failure_says_where_to_look_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        shown = public_error(errors.SandboxStartFailed("image corral-desktop:nope not found"))
    assert shown == {"code": "sandbox_start_failed", "message": "the sandbox did not start; see the gateway log"}
    assert "corral-desktop:nope" in caplog.text


def test_the_gateway_and_the_controller_answer_one_body_shape() -> None:
    exc = errors.ActionError(ErrorCode.OUT_OF_BOUNDS, "x is off the screen", "action.x")
    reply = failure("r1", exc)
    assert {key: value for key, value in reply.items() if key != "id"} == error_body(
        "out_of_bounds", "x is off the screen", "action.x"
    )
    assert error_body("not_found", "no session") == {
        "ok": False,
        "error": {"code": "not_found", "message": "no session"},
    }


async def test_handlers_answer_from_the_table() -> None:
    router = APIRouter()

    @router.get("/capacity")
    async def capacity() -> None:
        raise errors.CapacityError("this API key has 8 sessions")

    @router.get("/blamed")
    async def blamed() -> None:
        raise errors.ReplayUnreadable("no flows")

    app = FastAPI()
    app.state.metrics = Metrics()
    install(app)
    app.include_router(router)
    async with client_for(app) as anyone:
        capped, blamed_reply = await anyone.get("/capacity"), await anyone.get("/blamed")
        unknown, wrong_method = await anyone.get("/nowhere"), await anyone.post("/capacity")
    assert capped.status_code == 429
    assert capped.json() == error_body("too_many_sessions", "this API key has 8 sessions")
    assert blamed_reply.json() == error_body("replay_unreadable", "no flows", "hermetic")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert (wrong_method.status_code, wrong_method.json()["error"]["code"]) == (405, "method_not_allowed")


def test_the_documented_table_is_the_table() -> None:
    doc = (Path(__file__).parents[4] / "docs" / "gateway.md").read_text()
    documented = {(int(status), code) for status, code in re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", doc, re.M)}
    table = {(answer.status, str(cls.code)) for cls, answer in STATUS.items()}
    assert documented == table


def _statuses(text: str) -> set[tuple[int, str]]:
    """The (status, code) pairs a paragraph names as ``409 `a`, `b`; 507 `c```."""
    pairs = set()
    for status, codes in re.findall(r"\b(\d{3}) ((?:`[a-z_]+`(?:, | and )?)+)", text):
        pairs |= {(int(status), code) for code in re.findall(r"`([a-z_]+)`", codes)}
    return pairs


def test_the_controller_s_codes_the_gateway_passes_on_are_documented_as_the_controller_answers() -> None:
    docs = Path(__file__).parents[4] / "docs"
    gateway = (docs / "gateway.md").read_text()
    passed_on = _statuses(gateway.split("Passed on from the sandbox's controller", 1)[1].split("\n\n", 1)[0])
    http_status = (docs / "protocol.md").read_text().split("### HTTP status", 1)[1].split("\n\n", 2)[1]
    assert (409, "control_taken") in passed_on
    assert passed_on <= _statuses(http_status)
    assert not {code for _, code in passed_on} & {str(cls.code) for cls in STATUS}  # not the gateway's own
