"""The vendors' reference cases (tests/vendor_reference) in a real sandbox, as the agent's uid: codex's
apply-patch scenarios and lib.rs cases through the apply_patch action, the Anthropic demo's edit and
bash tests through the vendor translator (a tool_use in, a tool_result out), each against the
expected-difference table; and file permissions as the agent's own processes meet them: a file the
agent made read-only, one root owns, a read-only directory, a link to a file the agent may not write.
The editor and apply_patch refuse what the agent's ``echo >>`` is refused, and change nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

import vendor_reference as ref
from corral.client import SandboxClient
from corral.errors import ActionError
from corral.runtime import SandboxAddress

from .dockerutil import DockerHarness
from .vendor_fixtures import text_of, tool_result, tool_use

ROOT = "/workspace/vendor-ref"
CODEX = ref.load("codex/unit_cases.json")
EDIT = ref.load("anthropic-quickstarts/edit_cases.json")
BASH = ref.load("anthropic-quickstarts/bash_cases.json")

# The agent writes the files it is given (JSON: relative path -> text) under a directory, and lists
# what is there (every regular file's text, exactly, CRLF included).
WRITE = (
    "import json, os, sys\n"
    "root = sys.argv[1]\n"
    "for name, text in json.loads(sys.argv[2]).items():\n"
    "    path = os.path.join(root, name)\n"
    "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "    open(path, 'wb').write(text.encode())\n"
)
SNAPSHOT = (
    "import json, os, sys\n"
    "root, out = sys.argv[1], {}\n"
    "for top, _, names in os.walk(root):\n"
    "    for name in names:\n"
    "        path = os.path.join(top, name)\n"
    "        out[os.path.relpath(path, root)] = open(path, 'rb').read().decode()\n"
    "print(json.dumps(out, sort_keys=True))\n"
)


def _sh(runtime: DockerHarness, box: SandboxAddress, argv: list[str], user: str = "agent") -> str:
    code, out = runtime.exec(box.id, argv, user=user)
    assert code == 0, out
    return out


def _fresh(runtime: DockerHarness, box: SandboxAddress, name: str, files: dict[str, str]) -> str:
    """A new directory of the agent's holding ``files``."""
    folder = f"{ROOT}/{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"
    _sh(runtime, box, ["sh", "-c", f"chmod -R u+w {ROOT} 2>/dev/null; rm -rf {folder} && mkdir -p {folder}"])
    _sh(runtime, box, ["python3", "-c", WRITE, folder, json.dumps(files)])
    return folder


def _snapshot(runtime: DockerHarness, box: SandboxAddress, folder: str) -> dict[str, str]:
    found: dict[str, str] = json.loads(_sh(runtime, box, ["python3", "-c", SNAPSHOT, folder]))
    return found


@pytest.fixture(scope="module")
def workspace(runtime: DockerHarness, sandbox: SandboxAddress) -> Iterator[None]:
    _sh(runtime, sandbox, ["sh", "-c", f"rm -rf {ROOT} && mkdir -p {ROOT}"])
    yield
    # As the agent: root's files go too (their directories are the agent's; the sandbox's root has no capability).
    _sh(runtime, sandbox, ["sh", "-c", f"chmod -R u+w {ROOT}; rm -rf {ROOT}"])


# -- codex's patches through apply_patch ----------------------------------------------------------------------


def _apply(client: SandboxClient, folder: str, patch: str) -> str | None:
    """``patch`` through the apply_patch action, one file's operation at a time (nothing when a part
    is malformed; what was done stays when one fails, as codex). The error, or None."""
    try:
        operations = ref.prepared(patch, folder)
    except (ref.PatchRefused, ActionError) as exc:
        return str(exc)
    for operation in operations:
        action = {"type": "apply_patch", "operation": operation.kind, "path": operation.path, "diff": operation.diff}
        reply = client.request({"action": action})
        if not reply["ok"]:
            return str(reply["error"]["message"])
    return None


@pytest.mark.usefixtures("workspace")
@pytest.mark.parametrize("name", ref.scenario_names())
def test_codex_scenario_as_the_agent(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress, name: str
) -> None:
    given, patch, expected = ref.scenario(name)
    folder = _fresh(runtime, sandbox, name, given)
    error = _apply(client, folder, patch)
    got = _snapshot(runtime, sandbox, folder)
    ref.holds("codex/scenarios", name, got == expected, f"{got!r} != {expected!r} (error: {error})")
    owners = _sh(runtime, sandbox, ["sh", "-c", f"find {folder} -type f -printf '%u\\n' | sort -u"])
    assert owners.split() in ([], ["agent"]), owners  # whatever was written is the agent's


@pytest.mark.usefixtures("workspace")
@pytest.mark.parametrize("case", CODEX["apply"], ids=[case["id"] for case in CODEX["apply"]])
def test_codex_unit_case_as_the_agent(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress, case: dict[str, Any]
) -> None:
    folder = _fresh(runtime, sandbox, case["id"], case["files"])
    for name in case.get("read_only", []):
        _sh(runtime, sandbox, ["chmod", "0444", f"{folder}/{name}"])  # by the agent, as codex's test does
    error = _apply(client, folder, case["patch"])
    got = _snapshot(runtime, sandbox, folder)
    ref.holds("codex/unit_cases", case["id"], got == case["expected"], f"{got!r} (error: {error})")


# -- file permissions, as the agent's uid meets them --------------------------------------------------------


def _agent_may_append(runtime: DockerHarness, box: SandboxAddress, path: str) -> bool:
    code, _ = runtime.exec(box.id, ["sh", "-c", f"echo more >> {path}"], user="agent")
    return code == 0


def _writes(path: str) -> list[dict[str, Any]]:
    """Every way the editor and apply_patch change an existing file."""
    return [
        {"type": "edit", "command": "str_replace", "path": path, "old_str": "kept", "new_str": "changed"},
        {"type": "edit", "command": "insert", "path": path, "insert_line": 0, "new_str": "changed"},
        {"type": "apply_patch", "operation": "update_file", "path": path, "diff": "@@\n-kept\n+changed"},
        {"type": "apply_patch", "operation": "create_file", "path": path, "diff": "+changed\n"},
    ]


def _refused(client: SandboxClient, action: dict[str, Any]) -> dict[str, Any]:
    reply = client.request({"action": action})
    assert reply["ok"] is False, (action, reply)
    error: dict[str, Any] = reply["error"]
    assert (error["code"], error["field"]) == ("permission_denied", "action.path"), (action, error)
    return error


@pytest.mark.usefixtures("workspace")
def test_a_file_the_agent_made_read_only_is_refused_as_its_own_echo_is(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    folder = _fresh(runtime, sandbox, "read-only-file", {"ro.txt": "kept\n"})
    path = f"{folder}/ro.txt"
    _sh(runtime, sandbox, ["chmod", "0444", path])
    assert not _agent_may_append(runtime, sandbox, path)
    for action in _writes(path):
        error = _refused(client, action)
        assert error["message"] == (
            f"{path}: Permission denied: the agent may not write this file (its mode, or its owner), "
            "so the editor does not either"
        )
    assert _snapshot(runtime, sandbox, folder) == {"ro.txt": "kept\n"}  # unchanged, no temporary file left
    assert _sh(runtime, sandbox, ["stat", "-c", "%U %a", path]).split() == ["agent", "444"]
    # Made writable again by its owner, the same edit goes through and the mode stays the file's.
    _sh(runtime, sandbox, ["chmod", "0640", path])
    client.act(_writes(path)[0])
    assert _snapshot(runtime, sandbox, folder) == {"ro.txt": "changed\n"}
    assert _sh(runtime, sandbox, ["stat", "-c", "%U %a", path]).split() == ["agent", "640"]


@pytest.mark.usefixtures("workspace")
def test_a_file_root_owns_in_the_agents_directory_is_refused(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    # The agent owns the directory, so a rename over the file would succeed: the file's own mode decides.
    folder = _fresh(runtime, sandbox, "root-owned", {})
    path = f"{folder}/root.txt"
    # The sandbox's root holds no capability (no DAC override): the agent opens its directory for a moment.
    _sh(runtime, sandbox, ["chmod", "0777", folder])
    _sh(runtime, sandbox, ["sh", "-c", f"echo kept > {path} && chmod 0644 {path}"], user="root")
    _sh(runtime, sandbox, ["chmod", "0755", folder])
    assert not _agent_may_append(runtime, sandbox, path)
    for action in _writes(path):
        _refused(client, action)
    assert _snapshot(runtime, sandbox, folder) == {"root.txt": "kept\n"}
    assert _sh(runtime, sandbox, ["stat", "-c", "%U %a", path]).split() == ["root", "644"]
    # Through a link of the agent's, the file reached is the one checked.
    _sh(runtime, sandbox, ["ln", "-s", "root.txt", f"{folder}/link.txt"])
    for action in _writes(f"{folder}/link.txt")[:3]:
        _refused(client, action)
    assert _snapshot(runtime, sandbox, folder) == {"root.txt": "kept\n", "link.txt": "kept\n"}


@pytest.mark.usefixtures("workspace")
def test_a_read_only_directory_is_refused_with_its_name(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress
) -> None:
    # The file is writable (the agent's echo >> goes through) but its directory is not: the editor
    # writes a new file there and renames it into place, so it is refused, naming the directory
    # (docs/protocol.md, "File permissions": a deliberate difference from the references' in-place write).
    folder = _fresh(runtime, sandbox, "read-only-dir", {"d/f.txt": "kept\n", "d/ro.txt": "kept\n"})
    directory = f"{folder}/d"
    _sh(runtime, sandbox, ["sh", "-c", f"chmod 0444 {directory}/ro.txt && chmod 0555 {directory}"])
    assert not _agent_may_append(runtime, sandbox, f"{directory}/ro.txt")
    for action in _writes(f"{directory}/ro.txt"):
        _refused(client, action)
    for action in _writes(f"{directory}/f.txt"):
        error = _refused(client, action)
        assert f"the agent may not create files in {directory}, where the new text is written" in error["message"]
    created = _refused(client, {"type": "edit", "command": "create", "path": f"{directory}/new.txt", "file_text": "x"})
    assert directory in created["message"] and ".corral-write" not in created["message"]
    _sh(runtime, sandbox, ["chmod", "0755", directory])
    assert _snapshot(runtime, sandbox, folder) == {"d/f.txt": "kept\n", "d/ro.txt": "kept\n"}


# -- the Anthropic demo's edit and bash tests, through the vendor translator -----------------------------------


def _anthropic(client: SandboxClient, name: str, tool_input: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    block = tool_use(name, tool_input)
    reply = client.request({"anthropic": block})
    return reply, block


def _fill(value: Any, folder: str) -> Any:
    if isinstance(value, str):
        return value.replace("{dir}", folder)
    if isinstance(value, dict):
        return {key: _fill(item, folder) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, folder) for item in value]
    return value


def _edit_step(client: SandboxClient, runtime: DockerHarness, box: SandboxAddress, step: dict[str, Any]) -> list[str]:
    """One edit step against what the reference asserts; what did not hold."""
    reply, block = _anthropic(client, "str_replace_editor", step["input"])  # text_editor_20250124: undo_edit too
    misses: list[str] = []
    if "error" in step:
        result = tool_result(reply, block, ok=reply["ok"])
        if reply["ok"] or not re.search(re.escape(step["error"]), text_of(result)):
            misses.append(f"wanted an error matching {step['error']!r}, got {reply}")
        return misses
    if not reply["ok"]:
        return [f"failed: {reply['error']}"]
    text = text_of(tool_result(reply, block))
    misses += [f"{want!r} not in {text!r}" for want in step.get("output_contains", []) if want not in text]
    if "file" in step:
        path, wanted = step["file"]
        code, got = runtime.exec(box.id, ["cat", path], user="agent")
        if code != 0 or got != wanted:
            misses.append(f"{path} holds {got!r}, not {wanted!r}")
    return misses


@pytest.mark.usefixtures("workspace")
@pytest.mark.parametrize("case", EDIT["cases"], ids=[case["id"] for case in EDIT["cases"]])
def test_anthropic_edit_case(
    client: SandboxClient, runtime: DockerHarness, sandbox: SandboxAddress, case: dict[str, Any]
) -> None:
    folder = _fresh(runtime, sandbox, f"edit-{case['id']}", case["files"])
    misses = [miss for step in _fill(case["steps"], folder) for miss in _edit_step(client, runtime, sandbox, step)]
    ref.holds("anthropic-quickstarts/edit_cases", case["id"], not misses, "; ".join(misses))


def _bash_step(client: SandboxClient, step: dict[str, Any]) -> list[str]:
    reply, block = _anthropic(client, "bash", step["input"])
    if "error" in step:
        if reply["ok"] or not re.search(re.escape(step["error"]), reply["error"]["message"]):
            return [f"wanted an error matching {step['error']!r}, got {reply}"]
        tool_result(reply, block, ok=False)
        return []
    if not reply["ok"]:
        return [f"failed: {reply['error']}"]
    marked = bool(reply["result"]["tool_result"].get("is_error"))
    text = text_of(tool_result(reply, block, is_error=marked))
    misses: list[str] = []
    if "is_error" in step and marked is not step["is_error"]:
        misses.append(f"is_error {marked}, the reference's {step['is_error']}")
    if "text" in step and text.rstrip("\n") != step["text"]:  # the reference strips one final newline
        misses.append(f"{text!r} is not {step['text']!r}")
    if "text_contains" in step and step["text_contains"] not in text:
        misses.append(f"{step['text_contains']!r} not in {text!r}")
    return misses


@pytest.mark.parametrize("case", BASH["cases"], ids=[case["id"] for case in BASH["cases"]])
def test_anthropic_bash_case(client: SandboxClient, case: dict[str, Any]) -> None:
    misses = [miss for step in case["steps"] for miss in _bash_step(client, step)]
    ref.holds("anthropic-quickstarts/bash_cases", case["id"], not misses, "; ".join(misses))
