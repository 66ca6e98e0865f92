"""The Dockerfiles a build runs, generated: exec-form RUNs, no syntax line, the finishing stage."""

from __future__ import annotations

import json

from corral.gateway.templates.dockerfile import FINISH, finish_stage, first_stage
from corral.gateway.templates.spec import parse_yaml

SPEC = parse_yaml(
    b"""
apt: [make]
pip: [six]
npm: [left-pad]
files:
  - {src: bin/hello, dest: /usr/local/bin/hello, mode: "0755"}
  - {src: notes, dest: /home/agent/notes}
setup: [make, --version]
"""
)


def test_the_first_stage_installs_in_order_from_the_host_side_fetches() -> None:
    text = first_stage(SPEC, "sha256:base", frozenset({"notes"}), has_wheels=True, has_npm=True)
    lines = text.splitlines()
    assert lines[0] == "FROM sha256:base" and not any(line.startswith("# syntax") for line in lines)
    apt = json.loads(lines[1].removeprefix("RUN "))
    assert apt[:2] == ["/bin/sh", "-c"] and "apt-get install -y --no-install-recommends make" in apt[2]
    pip = next(json.loads(line[4:]) for line in lines if line.startswith("RUN") and "pip" in line)
    assert "--no-index" in pip and pip[-1] == "six"
    npm = next(json.loads(line[4:]) for line in lines if line.startswith("RUN") and '"npm"' in line)
    assert "--offline" in npm and npm[-1] == "left-pad"
    assert 'COPY ["files/bin/hello", "/usr/local/bin/hello"]' in lines
    assert 'RUN ["chmod", "0755", "/usr/local/bin/hello"]' in lines
    assert 'COPY ["files/notes/", "/home/agent/notes/"]' in lines  # a directory, whole
    assert lines[-1] == 'RUN ["make", "--version"]'


def test_nothing_asked_is_nothing_run() -> None:
    assert first_stage(parse_yaml(b""), "sha256:b", frozenset(), False, False) == "FROM sha256:b\n"


def test_the_finishing_stage_seeds_the_agents_mounts_and_hands_the_seed_to_the_agent() -> None:
    text = finish_stage("sha256:first")
    assert text.startswith("FROM sha256:first\n")
    assert "/usr/share/corral/template-env.json" in text
    assert "chown -R 1100:1100 /usr/share/corral/seed" in FINISH
    assert 'find "$d" -mindepth 1 -delete' in FINISH  # nothing left under the tmpfs mounts' places
