"""`corral up`'s env file: parsed strictly, checked whole against the settings model before anything
starts (every problem at once, never a value), file settings mounted, and the compose override that
hands each setting to the gateway by name only."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

import pytest

from corral.errors import SettingProblem, SettingsFileInvalid
from corral.gateway import envfile
from corral.gateway.envfile import EnvLine, FileMount

STRONG_KEY = "env-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf"


def _file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "corral.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def _problems(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(SettingsFileInvalid) as caught:
        envfile.load(path, environ or {})
    assert caught.value.path == str(path)
    return [str(problem) for problem in caught.value.problems]


def test_lines_comments_quotes_and_inline_comments() -> None:
    text = "\n".join(
        [
            "# the gateway's settings",
            "",
            "CORRAL_POOL_SIZE=2",
            "  CORRAL_MAX_SESSIONS = 4  # spaces around are fine",
            'CORRAL_MCP_ALLOWED_HOSTS="a.test, b.test # kept"  # this goes',
            "CORRAL_API_KEY='x#y $HOME'",
            "CORRAL_EGRESS_TRUSTED_NETWORKS=",
            "CORRAL_INSTANCE=blue#green",
        ]
    )
    lines, problems = envfile.parse(text)
    assert problems == []
    assert lines == [
        EnvLine(3, "CORRAL_POOL_SIZE", "2"),
        EnvLine(4, "CORRAL_MAX_SESSIONS", "4"),
        EnvLine(5, "CORRAL_MCP_ALLOWED_HOSTS", "a.test, b.test # kept"),
        EnvLine(6, "CORRAL_API_KEY", "x#y $HOME"),  # nothing expanded
        EnvLine(7, "CORRAL_EGRESS_TRUSTED_NETWORKS", ""),
        EnvLine(8, "CORRAL_INSTANCE", "blue#green"),  # a `#` only starts a comment after a space
    ]


def test_malformed_lines_are_named_by_number_and_never_quoted() -> None:
    text = "just-a-secret-token\nexport CORRAL_PORT=1\n=value\nCORRAL_API_KEY=\"open-secret\nCORRAL_X='a' b\n"
    lines, problems = envfile.parse(text)
    assert lines == []
    assert [(problem.line, problem.name) for problem in problems] == [
        (1, None),
        (2, None),
        (3, None),
        (4, "CORRAL_API_KEY"),
        (5, "CORRAL_X"),
    ]
    said = " ".join(str(problem) for problem in problems)
    assert "just-a-secret-token" not in said and "open-secret" not in said
    assert str(problems[0]) == "line 1: not NAME=VALUE (a name, `=`, then the value)"


def test_a_good_file_gives_its_settings(tmp_path: Path) -> None:
    path = _file(tmp_path, f"CORRAL_RECORDING_BUDGET_MB=512\nCORRAL_RECORD=false\nCORRAL_API_KEY={STRONG_KEY}\n")
    env = envfile.load(path, {})
    assert env.values == {
        "CORRAL_RECORDING_BUDGET_MB": "512",
        "CORRAL_RECORD": "false",
        "CORRAL_API_KEY": STRONG_KEY,
    }
    assert env.mounts == () and env.shadowed == () and env.warnings == ()


def test_every_problem_at_once_with_its_line_never_a_value(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "\n".join(
            [
                "CORRAL_RECORDNG_BUDGET_MB=512",  # a typo
                "CORRAL_POOL_SIZE=two",
                "HOME=/root",
                "CORRAL_EGRESS_MODE=block",
                "CORRAL_POOL_SIZE=3",
                "CORRAL_WORKSPACE_SIZE=1q",
                "CORRAL_API_KEY=short-guessable",
                "broken line",
            ]
        ),
    )
    problems = _problems(path)
    assert problems == [
        "line 1: CORRAL_RECORDNG_BUDGET_MB: no setting of the gateway; did you mean CORRAL_RECORDING_BUDGET_MB"
        " or CORRAL_RECORDING_MAX_BUDGET_MB?",
        "line 2: CORRAL_POOL_SIZE: Input should be a valid integer, unable to parse string as an integer",
        "line 3: HOME: not a setting of the gateway (they all start with CORRAL_) (docs/gateway.md lists them)",
        "line 4: CORRAL_EGRESS_MODE: Input should be 'enforce' or 'report'",
        "line 5: CORRAL_POOL_SIZE: set twice (one line of it is enough)",
        "line 6: CORRAL_WORKSPACE_SIZE: String should match pattern '^[0-9]+[kmg]?$'",
        problems[6],
        "line 8: not NAME=VALUE (a name, `=`, then the value)",
    ]
    assert problems[6].startswith("line 7: CORRAL_API_KEY: the API key") and "secrets.token_urlsafe(32)" in problems[6]
    assert "short-guessable" not in " ".join(problems) and "two" not in problems[1]


def test_the_error_says_what_and_that_nothing_started(tmp_path: Path) -> None:
    path = _file(tmp_path, "CORRAL_MAX_SESSIONS=0\n")
    with pytest.raises(SettingsFileInvalid) as caught:
        envfile.load(path, {})
    assert caught.value.problems == (
        SettingProblem(1, "CORRAL_MAX_SESSIONS", "Input should be greater than or equal to 1"),
    )
    assert str(caught.value) == (
        f"{path}: 1 problem, nothing was started:\n"
        "  line 1: CORRAL_MAX_SESSIONS: Input should be greater than or equal to 1"
    )


def test_the_environment_wins_and_its_value_is_checked(tmp_path: Path) -> None:
    path = _file(tmp_path, "CORRAL_POOL_SIZE=2\nCORRAL_MAX_SESSIONS=4\n")
    env = envfile.load(path, {"CORRAL_POOL_SIZE": "3", "CORRAL_URL": "http://127.0.0.1:1"})
    assert env.values == {"CORRAL_POOL_SIZE": "3", "CORRAL_MAX_SESSIONS": "4"}
    assert env.shadowed == ("CORRAL_POOL_SIZE",)
    assert _problems(path, {"CORRAL_POOL_SIZE": "-1"}) == [
        "line 1: CORRAL_POOL_SIZE: Input should be greater than or equal to 0"
        " (the value from your environment, which wins over the file)"
    ]


def test_file_settings_are_found_from_the_model() -> None:
    assert envfile.file_settings() == {"egress_upstream_ca", "profile_key_file"}  # data_dir: at its own path


def test_a_file_setting_is_mounted_read_only_relative_to_the_env_file(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    ca = tmp_path / "certs" / "internal ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = envfile.load(_file(tmp_path, "CORRAL_EGRESS_UPSTREAM_CA=certs/internal ca.pem\n"), {})
    target = PurePosixPath("/run/corral/settings/egress_upstream_ca")
    assert env.mounts == (FileMount("CORRAL_EGRESS_UPSTREAM_CA", ca.resolve(), target),)
    assert env.values == {"CORRAL_EGRESS_UPSTREAM_CA": "certs/internal ca.pem"}


def test_a_file_setting_without_its_file_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "CORRAL_EGRESS_UPSTREAM_CA=/nonexistent/ca.pem\nCORRAL_EGRESS_UPSTREAM_CA=\n")
    assert _problems(path) == [
        "line 1: CORRAL_EGRESS_UPSTREAM_CA: no such file: /nonexistent/ca.pem",
        "line 2: CORRAL_EGRESS_UPSTREAM_CA: set twice (one line of it is enough)",
    ]
    empty = _file(tmp_path, "CORRAL_EGRESS_UPSTREAM_CA=\n")
    assert _problems(empty) == [
        "line 1: CORRAL_EGRESS_UPSTREAM_CA: empty: leave the line out to leave the setting unset"
    ]


def test_the_data_dir_must_be_absolute(tmp_path: Path) -> None:
    assert _problems(_file(tmp_path, "CORRAL_DATA_DIR=data\n")) == [
        "line 1: CORRAL_DATA_DIR: must be an absolute path"
        " (it is mounted at the same path inside the gateway's container)"
    ]
    assert envfile.load(_file(tmp_path, "CORRAL_DATA_DIR=/srv/corral\n"), {}).mounts == ()


def test_a_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    path = _file(tmp_path, f"CORRAL_API_KEY={STRONG_KEY}\n", mode=0o644)
    env = envfile.load(path, {})
    assert env.warnings == (
        f"{path} is mode 0644: others may read it and it may hold CORRAL_API_KEY; chmod 600 {path}",
    )
    assert envfile.mode_warning(path, 0o100600) is None
    assert envfile.mode_warning(path, 0o100640) is not None


def test_image_tags_only_in_the_file_are_warned_about(tmp_path: Path) -> None:
    path = _file(tmp_path, "CORRAL_IMAGE=corral-desktop:mine\n")
    assert envfile.load(path, {"CORRAL_IMAGE": "corral-desktop:mine"}).warnings == ()
    (warning,) = envfile.load(path, {}).warnings
    assert warning.startswith("CORRAL_IMAGE comes from the env file")


def test_an_unreadable_file_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "corral.env"
    path.write_bytes(b"CORRAL_PORT=\xff\n")
    assert _problems(path) == ["cannot be read: not UTF-8 text"]


def test_locate_the_named_file_or_corral_env_at_the_root(tmp_path: Path) -> None:
    assert envfile.locate(None, tmp_path) is None
    with pytest.raises(SettingsFileInvalid, match="no such file"):
        envfile.locate(tmp_path / "missing.env", tmp_path)
    default = _file(tmp_path, "")
    assert envfile.locate(None, tmp_path) == default
    other = tmp_path / "other.env"
    other.write_text("")
    assert envfile.locate(other, tmp_path) == other


def test_read_into_puts_the_file_where_the_environment_has_nothing(tmp_path: Path) -> None:
    _file(tmp_path, "CORRAL_PORT=8711\nCORRAL_INSTANCE=blue\n")
    environ = {"CORRAL_INSTANCE": "green", "PATH": "/bin"}
    env = envfile.read_into(None, tmp_path, environ)
    assert env is not None and env.shadowed == ("CORRAL_INSTANCE",)
    assert environ == {"CORRAL_INSTANCE": "green", "PATH": "/bin", "CORRAL_PORT": "8711"}
    assert envfile.read_into(None, tmp_path / "nowhere", environ) is None


def test_the_override_names_settings_and_mounts_files_without_a_value(tmp_path: Path) -> None:
    ca = tmp_path / "ca$1.pem"
    ca.write_text("pem")
    path = _file(
        tmp_path, f"CORRAL_API_KEY={STRONG_KEY}\nCORRAL_RECORDING_BUDGET_MB=512\nCORRAL_EGRESS_UPSTREAM_CA={ca}\n"
    )
    document = envfile.override(envfile.load(path, {}))
    assert document == {
        "services": {
            "gateway": {
                "environment": [
                    "CORRAL_API_KEY",
                    "CORRAL_EGRESS_UPSTREAM_CA=/run/corral/settings/egress_upstream_ca",
                    "CORRAL_RECORDING_BUDGET_MB",
                ],
                "volumes": [
                    {
                        "type": "bind",
                        "source": str(tmp_path / "ca$$1.pem"),
                        "target": "/run/corral/settings/egress_upstream_ca",
                        "read_only": True,
                    }
                ],
            }
        }
    }
    assert STRONG_KEY not in json.dumps(document)


def test_the_compose_arguments_keep_the_files_compose_finds_itself(tmp_path: Path) -> None:
    override = tmp_path / "o.json"
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    assert envfile.compose_file_args(tmp_path, override) == ["-f", str(tmp_path / "compose.yaml"), "-f", str(override)]
    (tmp_path / "compose.override.yaml").write_text("services: {}\n")
    assert envfile.compose_file_args(tmp_path, override) == [
        "-f",
        str(tmp_path / "compose.yaml"),
        "-f",
        str(tmp_path / "compose.override.yaml"),
        "-f",
        str(override),
    ]


def test_compose_files_writes_a_private_override_for_the_command_only(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    env = envfile.load(_file(tmp_path, "CORRAL_RECORD=false\n"), {})
    with envfile.compose_files(tmp_path, env) as args:
        written = Path(args[-1])
        assert args[:3] == ["-f", str(tmp_path / "compose.yaml"), "-f"]
        assert json.loads(written.read_text()) == envfile.override(env)
        assert os.stat(written.parent).st_mode & 0o077 == 0
    assert not written.exists()
    with envfile.compose_files(tmp_path, None) as none:
        assert none == []
