"""The template file read: YAML into its frozen model, a Dockerfile on the base, names and references."""

from __future__ import annotations

import pytest

from corral.errors import TemplateInvalid, TemplateRefused
from corral.gateway.templates.spec import (
    TemplateSpec,
    parse_dockerfile,
    parse_ref,
    parse_template,
    parse_yaml,
)

GOOD = b"""
apt: [make, "jq=1.6-2.1"]
pip: ["requests==2.32.3", "rich[jupyter]>=13"]
npm: ["left-pad@1.3.0", "@scope/tool"]
files:
  - {src: tools/hello.sh, dest: /usr/local/bin/hello, mode: "0755"}
  - {src: notes, dest: /workspace/notes}
env: {GREETING: hi}
setup: "make --version"
"""


def test_a_whole_template_reads_into_its_frozen_model() -> None:
    spec = parse_yaml(GOOD)
    assert spec.apt == ["make", "jq=1.6-2.1"]
    assert spec.files[0].mode == 0o755 and spec.files[1].dest == "/workspace/notes"
    assert spec.env == {"GREETING": "hi"}
    assert spec.setup_argv() == ["bash", "-euo", "pipefail", "-c", "make --version"]
    with pytest.raises(Exception, match="frozen"):
        spec.apt = []  # type: ignore[misc]


def test_an_empty_file_is_the_base_as_it_is() -> None:
    assert parse_yaml(b"") == TemplateSpec()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (b"apt: [make]\nimage: debian\n", "image"),  # extra=forbid
        (b"apt: ['-o Dpkg::Options']\n", "apt.0"),  # never an option
        (b"pip: ['--index-url=http://x']\n", "pip.0"),
        (b"files: [{src: ../etc/passwd, dest: /x}]\n", "files.0.src"),
        (b"files: [{src: a, dest: relative}]\n", "files.0.dest"),
        (b"env: {HTTP_PROXY: x}\n", "env"),
        (b"env: {CORRAL_PROXY: x}\n", "env"),
        (b"setup: []\n", "setup"),
        (b"- a list\n", "file"),
        (b"apt: [make\n", "file"),  # not YAML
    ],
)
def test_what_is_not_a_template_is_refused_naming_its_field(text: bytes, field: str) -> None:
    with pytest.raises(TemplateInvalid) as caught:
        parse_yaml(text)
    assert caught.value.field is not None and caught.value.field.startswith(field)


def test_a_file_into_the_controllers_place_is_refused_with_the_reason() -> None:
    with pytest.raises(TemplateInvalid, match="/opt/corral"):
        parse_yaml(b"files: [{src: a, dest: /opt/corral/lib/x.py}]\n")


def test_a_setuid_mode_is_a_refusal_not_a_typo() -> None:
    with pytest.raises(TemplateRefused, match="setuid"):
        parse_yaml(b'files: [{src: a, dest: /usr/local/bin/a, mode: "4755"}]\n')


def test_a_list_too_long_is_refused() -> None:
    many = b"apt: [" + b", ".join(b"p%d" % n for n in range(65)) + b"]\n"
    with pytest.raises(TemplateInvalid, match="apt"):
        parse_yaml(many)


def test_a_dockerfile_on_the_base_is_taken_with_its_body() -> None:
    parsed = parse_dockerfile(b"FROM corral-desktop:latest\nRUN apt-get update\nENV A=b\n")
    assert parsed.body == "RUN apt-get update\nENV A=b"
    assert parse_template("corral.template.yaml", b"FROM corral-desktop:latest\n") == parsed.__class__("")


@pytest.mark.parametrize(
    ("text", "refused", "match"),
    [
        (b"FROM debian:bookworm\n", False, "first line"),
        (b"# syntax=docker/dockerfile:1\nFROM corral-desktop:latest\n", False, "first line"),
        (b"FROM corral-desktop:latest\nFROM debian AS x\n", False, "one FROM"),
        (b'FROM corral-desktop:latest\nENTRYPOINT ["sh"]\n', True, "ENTRYPOINT"),
        (b"FROM corral-desktop:latest\nRUN true\nuser agent\n", True, "USER"),
        (b'FROM corral-desktop:latest\nRUN true \\\n  && true\nCMD \\\n  ["x"]\n', True, "line 4: CMD"),
        (b"FROM corral-desktop:latest\nHEALTHCHECK NONE\n", True, "HEALTHCHECK"),
    ],
)
def test_a_dockerfile_that_leaves_the_base_or_its_boot_is_refused(text: bytes, refused: bool, match: str) -> None:
    with pytest.raises(TemplateRefused if refused else TemplateInvalid, match=match):
        parse_dockerfile(text)


def test_references_name_a_version_or_the_newest() -> None:
    assert str(parse_ref("py")) == "py" and parse_ref("py").version is None
    assert parse_ref("py-tools.2:7").version == 7
    for bad in ("Py", "py:0", "py:x", "-py", "py:", "a" * 49):
        with pytest.raises(TemplateInvalid):
            parse_ref(bad)
