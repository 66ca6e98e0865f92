"""Corral's one exception tree: every coded error has a stable code, and one body carries it."""

from __future__ import annotations

import inspect

from corral import errors
from corral.errors import ActionError, CodedError, CorralError, ErrorCode, RemoteError, error_body


def _coded_classes() -> list[type[CodedError]]:
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, CodedError)]


def test_every_error_is_a_corral_error_and_every_code_a_stable_one() -> None:
    classes = _coded_classes()
    assert len(classes) >= 20
    for cls in classes:
        assert issubclass(cls, CorralError) and isinstance(cls.code, ErrorCode)


def test_a_coded_error_is_its_own_body() -> None:
    exc = errors.ReplayUnreadable("no flows in it")
    assert (exc.code, exc.message, exc.field) == (ErrorCode.REPLAY_UNREADABLE, "no flows in it", "hermetic")
    assert error_body(exc.code, exc.message, exc.field) == {
        "ok": False,
        "error": {"code": "replay_unreadable", "message": "no flows in it", "field": "hermetic"},
    }
    assert errors.InvalidRequest("timeout_s is at most 10", field="timeout_s").to_dict() == {
        "code": "invalid_request",
        "message": "timeout_s is at most 10",
        "field": "timeout_s",
    }
    assert "field" not in errors.SessionNotFound("no session ses_1").to_dict()


def test_an_action_error_keeps_its_own_code() -> None:
    exc = ActionError(ErrorCode.UNKNOWN_KEY, "no key 'Hyper_Q'", "action.keys[0]")
    assert isinstance(exc, CodedError) and exc.code is ErrorCode.UNKNOWN_KEY
    assert exc.to_dict() == {"code": "unknown_key", "message": "no key 'Hyper_Q'", "field": "action.keys[0]"}
    assert repr(exc) == "ActionError(unknown_key, \"no key 'Hyper_Q'\", field='action.keys[0]')"


def test_a_remote_error_keeps_the_code_as_received() -> None:
    exc = RemoteError("503 from_the_future: later", code="from_the_future", status=503)
    assert (exc.code, exc.field, exc.status, str(exc)) == ("from_the_future", None, 503, "503 from_the_future: later")


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    """One tree, drawn in one place: a class anywhere else in the package that derives from an
    exception (by name: the addons need mitmproxy, so they are read, not imported) is a second tree."""
    import ast
    import builtins
    from pathlib import Path

    package = Path(errors.__file__).parent
    exception_names = {
        name for name, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, BaseException)
    }
    exception_names |= {name for name in dir(builtins) if name.endswith(("Error", "Exception"))} | {"Exception"}
    strays = [
        f"{path.relative_to(package)}:{node.lineno} {node.name}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(
            (base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else "")
            in exception_names
            for base in node.bases
        )
    ]
    assert strays == []


def test_secrets_without_egress_control_have_their_own_error() -> None:
    refused = errors.EgressOff("secrets need egress control, which this gateway runs without")
    assert (refused.code, refused.field) == (ErrorCode.EGRESS_OFF, "secrets")
    assert not isinstance(refused, errors.HermeticUnavailable)
