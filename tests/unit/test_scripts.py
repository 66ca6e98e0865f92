"""The shell scripts' own behaviour, each run from a copy of the tree with its heavy steps faked:
scripts/test leaves nothing running when a step fails, scripts/bootstrap-frameworks makes the
browser-use venv anew for another Python."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)


def _ends_within(pid: int, timeout_s: float) -> bool:
    """Whether the process ``pid`` has ended, or ends within ``timeout_s`` (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_a_failed_image_build_leaves_no_framework_install_running(tmp_path: Path) -> None:
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "test")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.move(tmp_path / "test", scripts / "test")
    started = tmp_path / "install.pid"
    for name in ("ensure-docker", "bootstrap"):
        _executable(scripts / name, "exit 0\n")
    # The install: a long child, its pid told once it runs.
    _executable(scripts / "bootstrap-frameworks", f"sleep 60 &\necho $! > {started}\nwait\n")
    for tool in ("ruff", "mypy", "pytest"):
        _executable(tmp_path / ".venv" / "bin" / tool, "exit 0\n")
        _executable(tmp_path / ".venv-proxy" / "bin" / tool, "exit 0\n")
    # The image build fails, once the install is under way.
    _executable(
        tmp_path / ".venv" / "bin" / "corral",
        f"for _ in $(seq 100); do [ -s {started} ] && exit 1; sleep 0.1; done\nexit 2\n",
    )
    done = subprocess.run(["bash", str(scripts / "test")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    install = int(started.read_text())
    ended = _ends_within(install, 5)
    if not ended:
        os.kill(install, signal.SIGKILL)  # not left behind by a failing run
    assert ended


def test_the_browser_use_venv_is_made_anew_for_another_python(tmp_path: Path) -> None:
    scripts, frameworks = tmp_path / "scripts", tmp_path / "tests" / "integration" / "frameworks"
    scripts.mkdir()
    frameworks.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "bootstrap-frameworks", scripts / "bootstrap-frameworks")
    lock = frameworks / "package-lock.json"
    lock.write_text("{}\n")
    (frameworks / "requirements-browser-use.txt").write_text("")  # nothing to fetch
    stamp = frameworks / "node_modules" / ".corral-installed"
    stamp.parent.mkdir()
    stamp.write_text(subprocess.run(["sha256sum", str(lock)], capture_output=True, text=True).stdout.split()[0] + "\n")
    # A venv left by another Python, its packages already stamped as installed.
    old = tmp_path / ".venv-browser-use"
    _executable(old / "bin" / "python", 'echo "Python 3.9.0"\n')
    (old / ".corral-installed").write_text("stale\n")
    fake_node = tmp_path / "bin"
    _executable(fake_node / "node", "echo 20\n")
    _executable(fake_node / "npm", "exit 0\n")
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{fake_node}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(scripts / "bootstrap-frameworks")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    made = subprocess.run([str(old / "bin" / "python"), "-V"], capture_output=True, text=True).stdout
    assert made.strip() == f"Python {sys.version.split()[0]}"
