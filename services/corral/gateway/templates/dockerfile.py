"""The Dockerfiles a template's build runs, generated (pure): the first stage from
``corral.template.yaml`` (or the template's own Dockerfile, its ``FROM`` pinned to the base's id),
and the finishing stage every template gets (its environment for commands, what it put under the
agent's tmpfs mounts moved into the seed boot copies from). Never a ``# syntax=`` line: the classic
builder, no frontend to fetch. Every ``RUN`` in exec form: no shell parses a package's name."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence

from corral.gateway.templates.context import GENERATED
from corral.gateway.templates.spec import DockerfileTemplate, TemplateSpec

WHEELS = f"{GENERATED}/wheels"  # in the context; /tmp/corral-template/wheels in the build
NPM_CACHE = f"{GENERATED}/npm-cache"
ENV_FILE = f"{GENERATED}/template-env.json"
STAGING = "/tmp/corral-template"
FILES = "files"  # the context's files under their own names (the Dockerfile's COPY sources)
SEED = "/usr/share/corral/seed"
IMAGE_ENV_FILE = "/usr/share/corral/template-env.json"
AGENT = "1100:1100"  # the image's agent uid and group: the seed is theirs, so boot copies it as the agent
SKELETON = (".bashrc", ".profile", ".bash_logout")  # useradd's copies in the base's /home/agent: not seeded

# What the finishing stage runs (as root, its own text: nothing of the template's in it).
FINISH = f"""set -eu
for f in {" ".join(SKELETON)}; do
  if cmp -s "/etc/skel/$f" "/home/agent/$f"; then rm -f "/home/agent/$f"; fi
done
for d in /home/agent /workspace; do
  if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then
    mkdir -p "{SEED}$d" && cp -a "$d/." "{SEED}$d/" && find "$d" -mindepth 1 -delete
  fi
done
if [ -d {SEED} ]; then chown -R {AGENT} {SEED}; fi
chmod 0644 {IMAGE_ENV_FILE}
"""


def _run(argv: Sequence[str]) -> str:
    return "RUN " + json.dumps(list(argv))


def _copy(src: str, dest: str) -> str:
    return "COPY " + json.dumps([src, dest])


def first_stage(spec: TemplateSpec, base_id: str, dirs: frozenset[str], has_wheels: bool, has_npm: bool) -> str:
    """A YAML template's Dockerfile: apt, pip from the wheelhouse, npm from its cache, files, setup.
    ``dirs`` are the context's directories (a ``src`` that is one is copied into ``dest`` whole)."""
    lines = [f"FROM {base_id}"]
    if spec.apt:
        # Debian's mirror over HTTP, as the base's own build: no HTTPS is needed inside the build.
        script = (
            "apt-get update && apt-get install -y --no-install-recommends "
            + " ".join(spec.apt)
            + " && apt-get clean && rm -rf /var/lib/apt/lists/*"
        )
        lines.append(_run(["/bin/sh", "-c", script]))
    if spec.pip and has_wheels:
        lines.append(_copy(WHEELS + "/", f"{STAGING}/wheels/"))
        pip = ["python3", "-m", "pip", "install", "--no-cache-dir", "--no-index", "--find-links", f"{STAGING}/wheels"]
        lines.append(_run([*pip, *spec.pip]))
        lines.append(_run(["rm", "-rf", f"{STAGING}/wheels"]))
    if spec.npm and has_npm:
        lines.append(_copy(NPM_CACHE + "/", f"{STAGING}/npm-cache/"))
        npm = ["npm", "install", "-g", "--offline", "--no-audit", "--no-fund", "--cache", f"{STAGING}/npm-cache"]
        lines.append(_run([*npm, *spec.npm]))
        lines.append(_run(["rm", "-rf", f"{STAGING}/npm-cache"]))
    for item in spec.files:
        is_dir = item.src in dirs
        source = posixpath.join(FILES, item.src) + ("/" if is_dir else "")
        lines.append(_copy(source, item.dest + ("/" if is_dir else "")))
        if item.mode is not None:
            lines.append(_run(["chmod", format(int(item.mode), "04o"), item.dest]))
    setup = spec.setup_argv()
    if setup is not None:
        lines.append(_run(setup))
    return "\n".join(lines) + "\n"


def dockerfile_stage(template: DockerfileTemplate, base_id: str) -> str:
    """A Dockerfile template's own lines, built on the base's id (the name it gave, pinned)."""
    return f"FROM {base_id}\n{template.body}\n"


def finish_stage(first_id: str) -> str:
    """The stage every template ends with: its environment file, its seed."""
    return "\n".join([f"FROM {first_id}", _copy(ENV_FILE, IMAGE_ENV_FILE), _run(["/bin/sh", "-c", FINISH])]) + "\n"


def env_file(env: dict[str, str]) -> bytes:
    return json.dumps(env, sort_keys=True).encode()
