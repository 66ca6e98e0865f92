"""The sidecar's mitmproxy command line and the per-session CA."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from cryptography import x509

from corral.proxy import ca
from corral.proxy.sidecar import proxy_argv, write_tokens


def _options(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--set")


def test_the_proxy_listens_on_the_session_address_only_with_the_addons(tmp_path: Path) -> None:
    env = {
        "CORRAL_SESSION": "ses_1",
        "CORRAL_STATE_DIR": str(tmp_path),
        "CORRAL_GATEWAY_TOKEN": "g",
        "CORRAL_CONTROLLER_TOKEN": "c",
        "CORRAL_TRUSTED_NETWORKS": "10.9.0.0/16",
    }
    argv = proxy_argv(env, "172.30.0.2")
    assert argv[:3] == [sys.executable, "-m", "corral.proxy.leanmaster"]
    options = _options(argv)
    assert (options["listen_host"], options["listen_port"]) == ("172.30.0.2", "8080")
    assert len(argv) == 3 + 2 * len(options)  # nothing but --set pairs after the module
    assert options["corral_control_host"] == "172.30.0.2"
    assert options["confdir"] == str(tmp_path / "ca")
    assert options["http3"] == "false" and options["connection_strategy"] == "eager"
    assert options["corral_mode"] == "enforce" and options["corral_allow_private"] == "false"
    assert options["corral_trusted_networks"] == "10.9.0.0/16"
    assert "ssl_verify_upstream_trusted_ca" not in options
    # No token on the command line (every host user reads /proc/<pid>/cmdline): a 0600 file instead.
    assert "g" not in options.values() and "c" not in options.values()
    assert not any("token=" in arg for arg in argv)
    tokens = tmp_path / "tokens.json"
    left = write_tokens(env, tokens)
    assert json.loads(tokens.read_text()) == {"gateway": "g", "controller": "c"}
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    assert "CORRAL_GATEWAY_TOKEN" not in left and "CORRAL_CONTROLLER_TOKEN" not in left
    assert left["CORRAL_SESSION"] == "ses_1"
    (tmp_path / "upstream-ca.pem").write_text("x")
    assert _options(proxy_argv(env, "172.30.0.2"))["ssl_verify_upstream_trusted_ca"].endswith("upstream-ca.pem")


def test_responses_are_kept_unless_turned_off_and_a_hermetic_proxy_never_dials(tmp_path: Path) -> None:
    env = {"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_RESPONSES_MAX_BODY": "1000"}
    options = _options(proxy_argv(env, "172.30.0.2"))
    assert (options["corral_keep_responses"], options.get("corral_hermetic")) == ("true", None)
    assert options["corral_responses_max_body"] == "1000"
    off = _options(proxy_argv({**env, "CORRAL_RECORD_RESPONSES": "0"}, "h"))
    assert off["corral_keep_responses"] == "false"
    hermetic = _options(proxy_argv({**env, "CORRAL_HERMETIC": "1"}, "h"))
    assert (hermetic["corral_hermetic"], hermetic["connection_strategy"], hermetic["corral_keep_responses"]) == (
        "true",
        "lazy",
        "false",
    )


def test_a_session_ca_is_a_ca_with_its_key_kept_private(tmp_path: Path) -> None:
    made = ca.create(tmp_path / "ca", "ses_abc")
    cert = x509.load_pem_x509_certificate(made.cert_pem.encode())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert "ses_abc" in cert.subject.rfc4514_string()
    secret = tmp_path / "ca" / ca.KEY_AND_CERT
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert "PRIVATE KEY" in secret.read_text() and "PRIVATE KEY" not in made.cert_pem
    assert (tmp_path / "ca" / ca.CERT_ONLY).read_text() == made.cert_pem
    assert ca.create(tmp_path / "other", "ses_abc").fingerprint_sha256 != made.fingerprint_sha256  # fresh each time


def test_the_audit_budget_the_gateway_sets_reaches_the_proxy_s_options(tmp_path: Path) -> None:
    env = {"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_AUDIT_MAX_BYTES": "65536"}
    assert _options(proxy_argv(env, "172.30.0.2"))["corral_audit_max_bytes"] == "65536"
    assert "corral_audit_max_bytes" not in _options(proxy_argv({**env, "CORRAL_AUDIT_MAX_BYTES": "-1"}, "h"))
