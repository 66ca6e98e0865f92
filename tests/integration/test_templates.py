"""Templates against the real images and a real gateway: a template adding a Debian package (make,
not in the base), files and an environment, built once for the module, and a session from its warm
pool that sees them as the agent; the cache; builds that fail (a package that does not exist, a
setup that exits 1) with their step and output, leaving nothing; the three ways to weaken the
sandbox refused (a setuid file, a write into /opt/corral, an ENTRYPOINT), and one the text does not
show (an image ENV the boot reads), refused by the check; a missing template at create."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.errors import GatewayError
from corral.gateway_client import Gateway
from corral.sdk import Sandbox
from corral.templatecontext import pack

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, module_gateway

NAME = f"i29tpl{os.getpid()}"
TEMPLATE = b"""
apt: [make]
files:
  - {src: hello.txt, dest: /workspace/hello.txt, mode: "0640"}
  - {src: greet.sh, dest: /usr/local/bin/greet, mode: "0755"}
  - {src: dotfiles, dest: /home/agent/.config/tool}
env: {GREETING: hello-from-template}
setup: "make --version > /usr/local/share/make-version"  # no pipe: head would end it with SIGPIPE (141)
"""


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness, desktop_image: str, egress_image: str
) -> Iterator[RunningGateway]:
    with module_gateway(tmp_path_factory, runtime, "tpl", pool={NAME: 1}, reap_interval_s=3600) as served:
        yield served
        with Gateway(served.url, KEY_A) as gateway:
            for template in gateway.templates():
                if template.mine:
                    gateway.delete_template(template.name)
        # Deleted while its pool's sandbox still ran from it: its names went all the same.
        assert _leftovers(runtime, NAME) == []


def _context(tmp: Path) -> Path:
    (tmp / "hello.txt").write_text("hello, agent\n")
    (tmp / "greet.sh").write_text('#!/bin/sh\necho "greet: $GREETING"\n')
    (tmp / "dotfiles").mkdir()
    (tmp / "dotfiles" / "config.toml").write_text("colour = true\n")
    (tmp / "corral.template.yaml").write_bytes(TEMPLATE)
    return tmp


@pytest.fixture(scope="module")
def built(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The module's one real build (apt from Debian's mirror inside it; about a minute)."""
    context = _context(tmp_path_factory.mktemp("ctx"))
    lines: list[str] = []
    with Gateway(gw.url, KEY_A) as gateway:
        packed, inside = pack(context / "corral.template.yaml", context)
        result = gateway.build_template(NAME, packed, inside, progress=lines.append)
    assert result.version == 1 and not result.cached
    assert any("apt-get install" in line for line in lines) and any("checking" in line for line in lines)
    return {"result": result, "context": context, "lines": lines}


def _tar(**files: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _build_error(gw: RunningGateway, name: str, **files: bytes) -> GatewayError:
    with Gateway(gw.url, KEY_A) as gateway, pytest.raises(GatewayError) as caught:
        gateway.build_template(name, _tar(**files))
    return caught.value


def _leftovers(runtime: DockerHarness, name: str) -> list[str]:
    """Images a build of ``name`` left: its build tags, its version tags."""
    tags = [tag for image in runtime.client.images.list() for tag in image.tags]
    return [tag for tag in tags if f"/{name}:" in tag]


def test_a_session_from_the_templates_pool_has_its_package_files_and_environment(
    gw: RunningGateway, built: dict[str, Any]
) -> None:
    gw.wait_pool(1, timeout_s=120)  # the template's pool (the base's is 0 here)
    with Sandbox.create(url=gw.url, api_key=KEY_A, template=NAME) as sb:
        assert sb.info.from_pool is True and sb.info.template == f"{NAME}:1"
        assert sb.exec(argv=["make", "--version"]).stdout.startswith("GNU Make")
        assert sb.exec(argv=["cat", "/usr/local/share/make-version"]).stdout.startswith("GNU Make")
        assert sb.exec(argv=["cat", "/workspace/hello.txt"]).stdout == "hello, agent\n"
        # Seeded at boot as the agent: its owner, the mode the template gave.
        assert sb.exec(argv=["stat", "-c", "%U %a", "/workspace/hello.txt"]).stdout.strip() == "agent 640"
        assert sb.exec(argv=["cat", "/home/agent/.config/tool/config.toml"]).stdout == "colour = true\n"
        assert sb.exec(argv=["greet"]).stdout.strip() == "greet: hello-from-template"
        assert sb.exec(argv=["sh", "-c", "echo $GREETING; id -un"]).stdout.split() == ["hello-from-template", "agent"]
        # The base's own skeleton files were not seeded over the agent's clean home.
        assert sb.exec(argv=["ls", "-A", "/home/agent"]).stdout.split().count(".bashrc") == 0


def test_another_key_uses_it_but_cannot_rebuild_or_delete_it(gw: RunningGateway, built: dict[str, Any]) -> None:
    with Gateway(gw.url, KEY_B) as other:
        shown = other.template(NAME)
        assert shown.latest == 1 and shown.mine is False
        with pytest.raises(GatewayError) as caught:
            other.delete_template(NAME)
        assert caught.value.status == 404
        with pytest.raises(GatewayError) as rebuilt:
            other.build_template(NAME, _tar(**{"corral.template.yaml": b"apt: [make]\n"}))
        assert rebuilt.value.status == 404


def test_the_same_template_and_context_give_the_same_version_back(gw: RunningGateway, built: dict[str, Any]) -> None:
    context = built["context"]
    started = time.monotonic()
    with Gateway(gw.url, KEY_A) as gateway:
        packed, inside = pack(context / "corral.template.yaml", context)
        again = gateway.build_template(NAME, packed, inside)
    assert again.cached and again.version == 1 and again.image_id == built["result"].image_id
    assert time.monotonic() - started < 10


def test_a_package_that_does_not_exist_fails_with_its_step_and_output_leaving_nothing(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    name = f"{NAME}-nopkg"
    error = _build_error(gw, name, **{"corral.template.yaml": b"apt: [corral-no-such-package]\n"})
    assert error.code == "template_build_failed"
    assert "apt-get install" in str(error) and "Unable to locate package corral-no-such-package" in str(error)
    _nothing_left(gw, runtime, name)


def test_a_setup_that_exits_1_fails_with_its_step_and_output(gw: RunningGateway, runtime: DockerHarness) -> None:
    name = f"{NAME}-setup"
    error = _build_error(gw, name, **{"corral.template.yaml": b"setup: 'echo about to fail; exit 1'\n"})
    assert error.code == "template_build_failed"
    assert "about to fail" in str(error) and "exit 1" in str(error)
    _nothing_left(gw, runtime, name)


def _nothing_left(gw: RunningGateway, runtime: DockerHarness, name: str) -> None:
    with Gateway(gw.url, KEY_A) as gateway, pytest.raises(GatewayError) as caught:
        gateway.template(name)
    assert caught.value.status == 404
    assert _leftovers(runtime, name) == []
    assert runtime.client.containers.list(all=True, filters={"label": "corral.role=check"}) == []


@pytest.mark.parametrize(
    ("suffix", "files", "reason"),
    [
        (
            "suid",
            {"corral.template.yaml": b"setup: 'cp /bin/true /usr/local/bin/su2 && chmod u+s /usr/local/bin/su2'\n"},
            "setuid or setgid file /usr/local/bin/su2",
        ),
        (
            "opt",
            {"corral.template.yaml": b"setup: 'echo import os > /opt/corral/lib/evil.py'\n"},
            "changes /opt/corral",
        ),
        (
            # A directory on the way to a checked path turned into a link to a copy (elsewhere: the
            # attack's copy sits under a mount its author fills): every file read through it is the
            # base's, the directory's own entry is not.
            "relink",
            {"corral.template.yaml": b"setup: 'cp -a /etc/xdg /etc/x && rm -r /etc/xdg && ln -s x /etc/xdg'\n"},
            "changes /etc/xdg, which",
        ),
        (
            # The directory the loader's /lib64 link names, read by itself (not with all of /usr).
            "loader",
            {"corral.template.yaml": b"setup: 'chmod 0777 /usr/lib64'\n"},
            "changes /usr/lib64",
        ),
        ("entry", {"Dockerfile": b'FROM corral-desktop:latest\nRUN true\nENTRYPOINT ["/bin/sh"]\n'}, "ENTRYPOINT"),
        ("preload", {"Dockerfile": b"FROM corral-desktop:latest\nENV LD_PRELOAD=/tmp/x.so\n"}, "LD_PRELOAD"),
    ],
)
def test_a_template_that_would_weaken_the_sandbox_is_refused_with_the_reason(
    gw: RunningGateway, runtime: DockerHarness, suffix: str, files: dict[str, bytes], reason: str
) -> None:
    name = f"{NAME}-{suffix}"
    error = _build_error(gw, name, **files)
    assert error.code == "template_refused" and reason in str(error), str(error)
    _nothing_left(gw, runtime, name)


def test_a_template_that_reroutes_what_the_boot_loads_is_refused_naming_each(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    """What the boot (root) loads besides the files it names: the link its venv's interpreter goes
    through, a zip Python reads its standard library from before /usr/lib/python3.11, and the modules
    the C library loads to look its users up. Each is the base's, or the template is refused."""
    name = f"{NAME}-reroute"
    setup = (
        "ln -sf /usr/bin/python3.11 /usr/bin/python3 && touch /usr/lib/python311.zip"
        " && sed -i 's/^passwd:.*/passwd: evil files/' /etc/nsswitch.conf"
    )
    error = _build_error(gw, name, **{"corral.template.yaml": f"setup: {json.dumps(setup)}\n".encode()})
    assert error.code == "template_refused", str(error)
    for path in ("/usr/bin/python3", "/usr/lib/python311.zip", "/etc/nsswitch.conf"):
        assert f"it changes {path}, which is the base's" in str(error), str(error)
    _nothing_left(gw, runtime, name)


def test_a_missing_template_at_create_is_a_404_naming_it(gw: RunningGateway) -> None:
    with gw.client() as c:
        missing = c.post("/v1/sessions", json={"template": f"{NAME}-absent"})
        assert missing.status_code == 404
        assert missing.json()["error"]["field"] == "template" and f"{NAME}-absent" in missing.json()["error"]["message"]
        version = c.post("/v1/sessions", json={"template": f"{NAME}:99"})
        assert version.status_code == 404 and f"{NAME}:99" in version.json()["error"]["message"]
