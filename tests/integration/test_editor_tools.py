"""The editor, apply_patch, file_glob and file_grep in the real sandbox, as the agent's uid: each
command and its error, files owned by the agent, paths the agent cannot write refused with nothing
changed, symlinks that lead nowhere the agent could not go itself, and a patch that is all or
nothing. After every bad input the session carries on."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from corral.client import SandboxClient
from corral.runtime import SandboxAddress

from .dockerutil import DockerHarness

W = "/workspace/edit-it"


def _failed(client: SandboxClient, action: dict[str, Any]) -> dict[str, Any]:
    reply = client.request({"action": action})
    assert reply["ok"] is False, reply
    error: dict[str, Any] = reply["error"]
    return error


def _edit(client: SandboxClient, **fields: Any) -> dict[str, Any]:
    result: dict[str, Any] = client.act({"type": "edit", **fields})["result"]
    return result


def _sh(runtime: DockerHarness, box: SandboxAddress, script: str, user: str = "agent") -> str:
    code, out = runtime.exec(box.id, ["sh", "-c", script], user=user)
    assert code == 0, out
    return out


def _digest(runtime: DockerHarness, box: SandboxAddress, path: str) -> str:
    return _sh(runtime, box, f"sha256sum {path}", user="corral").split()[0]


def _still_working(client: SandboxClient) -> None:
    assert client.act({"type": "file_stat", "path": "/workspace"})["result"]["type"] == "directory"
    assert len(client.screenshot("jpeg")) > 1000


@pytest.fixture()
def workdir(runtime: DockerHarness, sandbox: SandboxAddress) -> str:
    _sh(runtime, sandbox, f"rm -rf {W} && mkdir -p {W}")
    return W


def test_every_editor_command_as_the_agent(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str
) -> None:
    path = f"{workdir}/pkg/app.py"
    assert _edit(client, command="create", path=path, file_text="import os\ndebug = True\n\tindent\n") == {
        "output": f"File created successfully at: {path}",
        "path": path,
    }
    assert _sh(runtime, sandbox, f"stat -c '%U %a' {path}").strip() == "agent 644"

    view = _edit(client, command="view", path=path)["output"]
    assert view == (
        f"Here's the result of running `cat -n` on {path}:\n"
        "     1\timport os\n     2\tdebug = True\n     3\t\tindent\n     4\t\n"
    )
    ranged = _edit(client, command="view", path=path, view_range=[2, -1])["output"]
    assert ranged.splitlines()[1:] == ["     2\tdebug = True", "     3\t\tindent", "     4\t"]

    replaced = _edit(client, command="str_replace", path=path, old_str="debug = True", new_str="debug = False")
    assert replaced["output"].startswith(f"The file {path} has been edited. Here's the result of running `cat -n`")
    inserted = _edit(client, command="insert", path=path, insert_line=1, new_str="import sys")
    assert "     2\timport sys\n" in inserted["output"]
    assert _sh(runtime, sandbox, f"cat {path}") == "import os\nimport sys\ndebug = False\n\tindent\n"  # the tab kept

    undone = _edit(client, command="undo_edit", path=path)
    assert undone["output"].startswith(f"Last edit to {path} undone successfully. ")
    assert _sh(runtime, sandbox, f"cat {path}") == "import os\ndebug = False\n\tindent\n"
    assert _sh(runtime, sandbox, f"stat -c '%U %a' {path}").strip() == "agent 644"

    listing = _edit(client, command="view", path=workdir)["output"]
    _sh(runtime, sandbox, f"touch {workdir}/.hidden")
    assert listing == (
        f"Here's the files and directories up to 2 levels deep in {workdir}, excluding hidden items:\n"
        f"{workdir}\n{workdir}/pkg\n{workdir}/pkg/app.py\n\n"
    )
    assert ".hidden" not in _edit(client, command="view", path=workdir)["output"]
    all_of_them = _edit(client, command="str_replace", path=path, old_str="o", new_str="0", replace_all=True)
    assert "occurrences of old_str were replaced" in all_of_them["output"]
    assert _sh(runtime, sandbox, f"cat {path}") == "imp0rt 0s\ndebug = False\n\tindent\n"


def test_editor_errors_with_the_reference_wording(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str
) -> None:
    path = f"{workdir}/f.txt"
    _sh(runtime, sandbox, f"printf 'a = 1\\nb = 1\\n' > {path}; printf '\\377\\376' > {workdir}/blob")
    cases: list[tuple[dict[str, Any], str, str, str]] = [
        (
            {"command": "str_replace", "path": path, "old_str": "c = 1"},
            "no_match",
            "action.old_str",
            f"No replacement was performed, old_str `c = 1` did not appear verbatim in {path}.",
        ),
        (
            {"command": "str_replace", "path": path, "old_str": "= 1", "new_str": "= 2"},
            "multiple_matches",
            "action.old_str",
            "No replacement was performed. Multiple occurrences of old_str `= 1` in lines [1, 2]. Please ensure it is "
            "unique",
        ),
        (
            {"command": "create", "path": path, "file_text": "x"},
            "file_exists",
            "action.path",
            f"File already exists at: {path}. Cannot overwrite files using command `create`.",
        ),
        (
            {"command": "view", "path": f"{workdir}/nope"},
            "no_such_file",
            "action.path",
            f"The path {workdir}/nope does not exist. Please provide a valid path.",
        ),
        (
            {"command": "insert", "path": path, "insert_line": 9, "new_str": "x"},
            "invalid_field",
            "action.insert_line",
            "Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 3]",
        ),
        (
            {"command": "view", "path": path, "view_range": [4, 5]},
            "invalid_field",
            "action.view_range",
            "Invalid `view_range`: [4, 5]. Its first element `4` should be within the range of lines of the file: "
            "[1, 3]",
        ),
        (
            {"command": "undo_edit", "path": path},
            "nothing_to_undo",
            "action.path",
            f"No edit history found for {path}.",
        ),
        (
            {"command": "view", "path": "edit-it/f.txt"},
            "invalid_field",
            "action.path",
            "The path edit-it/f.txt is not an absolute path, it should start with `/`. "
            "Maybe you meant /workspace/edit-it/f.txt?",
        ),
    ]
    for fields, code, field, message in cases:
        error = _failed(client, {"type": "edit", **fields})
        assert (error["code"], error["field"], error["message"]) == (code, field, message), fields
    binary = _failed(client, {"type": "edit", "command": "view", "path": f"{workdir}/blob"})
    assert binary["code"] == "invalid_request" and "is not UTF-8 text" in binary["message"]
    assert _sh(runtime, sandbox, f"cat {path}") == "a = 1\nb = 1\n"
    _still_working(client)


@pytest.mark.parametrize(
    "action",
    [
        {"type": "edit", "command": "str_replace", "path": "/etc/passwd", "old_str": "root:x", "new_str": "root:"},
        {
            "type": "edit",
            "command": "insert",
            "path": "/etc/passwd",
            "insert_line": 0,
            "new_str": "evil::0:0::/:/bin/sh",
        },
        {
            "type": "apply_patch",
            "operation": "update_file",
            "path": "/etc/passwd",
            "diff": "@@\n-root:x:0:0:root:/root:/bin/bash\n+x",
        },
        {"type": "apply_patch", "operation": "delete_file", "path": "/etc/passwd"},
    ],
)
def test_a_file_the_agent_cannot_write_is_refused_and_unchanged(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, action: dict[str, Any]
) -> None:
    before = _digest(runtime, sandbox, "/etc/passwd")
    error = _failed(client, action)
    assert (error["code"], error["field"]) == ("permission_denied", "action.path"), error
    assert _digest(runtime, sandbox, "/etc/passwd") == before
    _still_working(client)


def test_a_directory_of_another_uid_is_refused(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness
) -> None:
    locked = "/tmp/corral-edit-locked"
    _sh(
        runtime,
        sandbox,
        f"rm -rf {locked}; mkdir -m 0755 {locked} && echo kept > {locked}/f && chmod 0500 {locked}",
        "corral",
    )
    for action in (
        {"type": "edit", "command": "create", "path": f"{locked}/new.txt", "file_text": "x"},
        {"type": "edit", "command": "str_replace", "path": f"{locked}/f", "old_str": "kept", "new_str": "gone"},
        {"type": "apply_patch", "operation": "create_file", "path": f"{locked}/new.txt", "diff": "+x"},
        {"type": "apply_patch", "operation": "update_file", "path": f"{locked}/f", "diff": "@@\n-kept\n+gone"},
    ):
        error = _failed(client, action)
        assert (error["code"], error["field"]) == ("permission_denied", "action.path"), (action, error)
    assert _sh(runtime, sandbox, f"ls -A {locked}; cat {locked}/f", "corral") == "f\nkept\n"
    _still_working(client)


def test_symlinks_lead_only_where_the_agent_could_go(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str
) -> None:
    _sh(
        runtime,
        sandbox,
        f"ln -s /run/corral/controller/secret {workdir}/secret && ln -s /etc/shadow {workdir}/shadow "
        f"&& ln -s /etc/passwd {workdir}/passwd",
    )
    passwd = _digest(runtime, sandbox, "/etc/passwd")
    for name in ("secret", "shadow"):
        for action in (
            {"type": "edit", "command": "view", "path": f"{workdir}/{name}"},
            {"type": "edit", "command": "str_replace", "path": f"{workdir}/{name}", "old_str": "root", "new_str": "x"},
            {"type": "apply_patch", "operation": "update_file", "path": f"{workdir}/{name}", "diff": "@@\n-root\n+x"},
        ):
            error = _failed(client, action)
            assert (error["code"], error["field"]) == ("permission_denied", "action.path"), (action, error)
    # Readable through the link, as the agent may read /etc/passwd; never written through it.
    assert "root:x:0:0" in _edit(client, command="view", path=f"{workdir}/passwd")["output"]
    error = _failed(
        client,
        {
            "type": "edit",
            "command": "str_replace",
            "path": f"{workdir}/passwd",
            "old_str": "root:x",
            "new_str": "root:",
        },
    )
    assert error["code"] == "permission_denied"
    assert _digest(runtime, sandbox, "/etc/passwd") == passwd
    assert _sh(runtime, sandbox, f"readlink {workdir}/passwd").strip() == "/etc/passwd"
    grep = _failed(client, {"type": "file_grep", "pattern": "root", "path": "/run/corral/controller"})
    assert grep["code"] == "permission_denied"
    found = client.act({"type": "file_grep", "pattern": ".", "path": workdir})["result"]
    assert found == {"matches": [], "truncated": False}  # ripgrep follows no link
    _still_working(client)


def test_apply_patch_create_update_delete_and_all_or_nothing(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str
) -> None:
    created = client.act(
        {
            "type": "apply_patch",
            "operation": "create_file",
            "path": "edit-it/p/mod.py",
            "diff": "+def f():\n+    return 1\n+\n+def g():\n+    return 2\n",
        }
    )
    assert created["result"] == {"output": f"Created {workdir}/p/mod.py", "path": f"{workdir}/p/mod.py"}
    path = f"{workdir}/p/mod.py"
    assert _sh(runtime, sandbox, f"stat -c '%U %a' {path}").strip() == "agent 644"
    diff = "@@ def g():\n-    return 2\n+    return 3\n"
    updated = client.act({"type": "apply_patch", "operation": "update_file", "path": path, "diff": diff})
    assert updated["result"]["output"] == f"Updated {path}"
    assert _sh(runtime, sandbox, f"cat {path}") == "def f():\n    return 1\n\ndef g():\n    return 3\n"

    before = hashlib.sha256(_sh(runtime, sandbox, f"cat {path}").encode()).hexdigest()
    second_fails = "@@\n-    return 1\n+    return 10\n@@\n-    return 99\n+    return 100\n"
    error = _failed(client, {"type": "apply_patch", "operation": "update_file", "path": path, "diff": second_fails})
    assert (error["code"], error["field"]) == ("patch_failed", "action.diff")
    assert error["message"].endswith(":\n    return 99")
    assert hashlib.sha256(_sh(runtime, sandbox, f"cat {path}").encode()).hexdigest() == before
    assert _sh(runtime, sandbox, f"ls -A {workdir}/p") == "mod.py\n"  # no temporary file left

    # create_file over an existing file replaces it (codex's *** Add File:); a directory there is refused.
    directory = _failed(client, {"type": "apply_patch", "operation": "create_file", "path": workdir, "diff": "+x"})
    assert directory["code"] == "is_a_directory"
    missing = _failed(
        client, {"type": "apply_patch", "operation": "update_file", "path": f"{workdir}/no.py", "diff": "@@\n-a\n+b"}
    )
    assert missing["code"] == "no_such_file"
    malformed = _failed(
        client, {"type": "apply_patch", "operation": "update_file", "path": path, "diff": "@@\n-def f():\nbogus"}
    )
    assert (malformed["code"], malformed["field"]) == ("invalid_field", "action.diff")
    deleted = client.act({"type": "apply_patch", "operation": "delete_file", "path": path})
    assert deleted["result"]["output"] == f"Deleted {path}"
    assert _sh(runtime, sandbox, f"ls -A {workdir}/p") == ""
    _still_working(client)


def test_glob_and_grep(client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str) -> None:
    _sh(
        runtime,
        sandbox,
        f"mkdir -p {workdir}/src/deep && echo 'x = 1  # TODO' > {workdir}/src/deep/old.py "
        f"&& touch -d '2020-01-01' {workdir}/src/deep/old.py && printf 'y = 2\\nTODO: more\\n' > {workdir}/src/new.py "
        f"&& echo todo > {workdir}/notes.txt && ln -s /etc {workdir}/etc-link",
    )
    globbed = client.act({"type": "file_glob", "pattern": "**/*.py", "path": workdir})["result"]
    assert globbed == {"paths": [f"{workdir}/src/new.py", f"{workdir}/src/deep/old.py"], "truncated": False}
    through_link = client.act({"type": "file_glob", "pattern": "etc-link/**", "path": workdir})["result"]
    assert through_link["paths"] == []  # the link is not followed out of the tree

    found = client.act({"type": "file_grep", "pattern": "TODO", "path": workdir})["result"]
    assert sorted((m["path"], m["line"], m["text"]) for m in found["matches"]) == [
        (f"{workdir}/src/deep/old.py", 1, "x = 1  # TODO"),
        (f"{workdir}/src/new.py", 2, "TODO: more"),
    ]
    folded = client.act({"type": "file_grep", "pattern": "todo", "path": workdir, "ignore_case": True, "glob": "*.txt"})
    assert [m["path"] for m in folded["result"]["matches"]] == [f"{workdir}/notes.txt"]
    capped = client.act({"type": "file_grep", "pattern": "TODO", "path": workdir, "limit": 1})["result"]
    assert (len(capped["matches"]), capped["truncated"]) == (1, True)

    bad = _failed(client, {"type": "file_grep", "pattern": "a(", "path": workdir})
    assert (bad["code"], bad["field"]) == ("invalid_field", "action.pattern")
    assert "unclosed group" in bad["message"]
    _still_working(client)


def test_a_huge_view_and_a_crlf_edit_answer_and_the_session_carries_on(
    client: SandboxClient, sandbox: SandboxAddress, runtime: DockerHarness, workdir: str
) -> None:
    # 2M empty lines viewed with the largest max_characters: numbered whole, the reply was ~94 MB
    # and the 16 MiB frame limit closed the connection. Now the numbered text is cut too.
    lines = f"{workdir}/lines.txt"
    _sh(runtime, sandbox, f"head -c 2000000 /dev/zero | tr '\\0' '\\n' > {lines}")
    shown = _edit(client, command="view", path=lines, max_characters=1 << 24)["output"]
    assert 1 << 20 < len(shown) < (2 << 20) + 2_000
    assert "<response clipped>" in shown
    many = _failed(client, {"type": "edit", "command": "str_replace", "path": lines, "old_str": "\n", "new_str": ""})
    assert many["code"] == "multiple_matches" and "... and 1999900 more]" in many["message"]
    # A CRLF file is edited as LF and keeps its CRLF line ends.
    dos = f"{workdir}/dos.txt"
    _sh(runtime, sandbox, f"printf 'one\\r\\ntwo\\r\\n' > {dos}")
    _edit(client, command="str_replace", path=dos, old_str="one\ntwo", new_str="1\n2")
    assert _sh(runtime, sandbox, f"od -c {dos} | head -1").split()[1:] == ["1", "\\r", "\\n", "2", "\\r", "\\n"]
    _still_working(client)
