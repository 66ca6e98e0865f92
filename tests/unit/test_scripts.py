"""The shell scripts' own behaviour, each run from a copy of the tree with its heavy steps faked:
scripts/test leaves nothing running when a step fails, scripts/bootstrap-frameworks makes the
browser-use venv anew for another Python, scripts/bootstrap installs the test tools only when asked."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_failed_unit_test_run_leaves_no_build_running(tmp_path: Path) -> None:
    """The images and the frameworks build while the unit tests run: a red unit run stops both."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts" / "test", scripts / "test")
    for name in ("ensure-docker", "bootstrap"):
        _executable(scripts / name, "exit 0\n")
    built, installed = tmp_path / "build.pid", tmp_path / "install.pid"
    _executable(scripts / "bootstrap-frameworks", f"sleep 60 &\necho $! > {installed}\nwait\n")
    _executable(tmp_path / ".venv" / "bin" / "corral", f"sleep 60 &\necho $! > {built}\nwait\n")
    for tool in ("ruff", "mypy"):
        _executable(tmp_path / ".venv" / "bin" / tool, "exit 0\n")
    _executable(tmp_path / ".venv-proxy" / "bin" / "mypy", "exit 0\n")
    _executable(tmp_path / ".venv-proxy" / "bin" / "pytest", "exit 0\n")
    # The unit run fails once both builds are under way.
    _executable(
        tmp_path / ".venv" / "bin" / "pytest",
        f"for _ in $(seq 100); do [ -s {built} ] && [ -s {installed} ] && exit 1; sleep 0.1; done\nexit 2\n",
    )
    done = subprocess.run(["bash", str(scripts / "test")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    for pidfile in (built, installed):
        child = int(pidfile.read_text())
        ended = _ends_within(child, 5)
        if not ended:
            os.kill(child, signal.SIGKILL)  # not left behind by a failing run
        assert ended, pidfile.name


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


def _bootstrap_tree(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A tree with scripts/bootstrap and a fake Python: ``-m venv DIR`` makes DIR/bin/python (itself), anything
    else is logged (``VENV: args``) and succeeds."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap", tmp_path / "scripts" / "bootstrap")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'corral'\n")
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "requirements-dev.txt").write_text("mitmproxy==11.0.2\n")
    calls = tmp_path / "calls.log"
    python = tmp_path / "fake" / "python"
    _executable(
        python,
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi\n'
        f'echo "$(basename "$(dirname "$(dirname "$0")")"): $*" >> {calls}\n',
    )
    return tmp_path / "scripts" / "bootstrap", calls, {**os.environ, "PYTHON": str(python)}


def test_bootstrap_installs_corral_with_its_commands_extras_for_the_main_job(tmp_path: Path) -> None:
    bootstrap, calls, env = _bootstrap_tree(tmp_path)
    done = subprocess.run(["bash", str(bootstrap)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installs = [line for line in calls.read_text().splitlines() if "-U pip" not in line]
    assert installs == [f".venv: -m pip install -q --disable-pip-version-check -e {tmp_path}[all]"]
    assert not (tmp_path / ".venv-proxy").exists()
    # Once installed, a second run installs nothing.
    before = calls.read_text()
    assert subprocess.run(["bash", str(bootstrap)], env=env, timeout=60).returncode == 0
    assert calls.read_text() == before


def test_bootstrap_for_the_tests_adds_the_dev_extras_and_the_proxy_venv(tmp_path: Path) -> None:
    bootstrap, calls, env = _bootstrap_tree(tmp_path)
    assert subprocess.run(["bash", str(bootstrap)], env=env, timeout=60).returncode == 0
    done = subprocess.run(["bash", str(bootstrap), "--tests"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installs = [line for line in calls.read_text().splitlines() if "-U pip" not in line]
    assert installs[1:] == [
        f".venv: -m pip install -q --disable-pip-version-check -e {tmp_path}[dev]",
        f".venv-proxy: -m pip install -q --disable-pip-version-check -r {tmp_path}/proxy/requirements-dev.txt",
        f".venv-proxy: -m pip install -q --disable-pip-version-check --no-deps -e {tmp_path}",
    ]
    # The dev install serves the main job too: nothing more to install for it.
    before = calls.read_text()
    assert subprocess.run(["bash", str(bootstrap)], env=env, timeout=60).returncode == 0
    assert calls.read_text() == before


def _test_tree(tmp_path: Path, pytest_body: str) -> Path:
    """A tree with scripts/test, every step but .venv's pytest passing at once; pytest runs ``pytest_body``."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts" / "test", scripts / "test")
    for name in ("ensure-docker", "bootstrap", "bootstrap-frameworks"):
        _executable(scripts / name, "exit 0\n")
    for tool in ("corral", "ruff", "mypy"):
        _executable(tmp_path / ".venv" / "bin" / tool, "exit 0\n")
    for tool in ("mypy", "pytest"):
        _executable(tmp_path / ".venv-proxy" / "bin" / tool, "exit 0\n")
    _executable(tmp_path / ".venv" / "bin" / "pytest", pytest_body)
    return scripts / "test"


def test_the_suite_runs_on_two_workers_and_the_alone_tests_after_them_by_themselves(tmp_path: Path) -> None:
    calls = tmp_path / "pytest.log"
    script = _test_tree(tmp_path, f'echo "$*" >> {calls}\nexit 0\n')
    # The default, whatever the shell running this suite asked for (scripts/test may run under it).
    default = {name: value for name, value in os.environ.items() if name != "CORRAL_IT_WORKERS"}
    done = subprocess.run(["bash", str(script)], env=default, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "-q -p no:cacheprovider -n 2 tests/unit tests/packaging",
        "-q -p no:cacheprovider -n 2 --dist loadfile -m not alone and not swarm tests/integration",
        "-q -p no:cacheprovider -m alone and not swarm tests/integration",
        "-q -p no:cacheprovider -p no:xdist -m swarm tests/integration",  # one process: one swarm for all of them
    ]
    # One worker when asked (no xdist at all); the `alone` ones still after them.
    calls.unlink()
    env = {**default, "CORRAL_IT_WORKERS": "1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines()[1:] == [
        "-q -p no:cacheprovider -m not alone and not swarm tests/integration",
        "-q -p no:cacheprovider -m alone and not swarm tests/integration",
        "-q -p no:cacheprovider -p no:xdist -m swarm tests/integration",
    ]


@pytest.mark.parametrize(
    ("parallel", "alone", "swarm", "code", "runs"),
    [
        (0, 5, 5, 0, "alone swarm"),  # a path with neither `alone` nor `swarm` tests
        (5, 0, 5, 0, "alone swarm"),  # a path with `alone` tests only
        (5, 5, 0, 0, "alone swarm"),  # a path with `swarm` tests only
        (5, 5, 5, 1, "alone swarm"),  # nothing collected at all: a failure
        (1, 0, 0, 1, ""),  # a failure on the workers stops the run there
        (0, 1, 0, 1, "alone"),  # a failure alone fails the run, before the swarm starts
        (0, 0, 1, 1, "alone swarm"),  # a failure on the swarm fails the run
    ],
)
def test_an_integration_run_fails_when_any_part_fails_or_none_collects(
    tmp_path: Path, parallel: int, alone: int, swarm: int, code: int, runs: str
) -> None:
    ran = tmp_path / "ran"
    body = (
        f'case "$*" in *"-m alone"*) echo alone >> {ran}; exit {alone} ;;'
        f' *"-m swarm"*) echo swarm >> {ran}; exit {swarm} ;; *) exit {parallel} ;; esac\n'
    )
    script = _test_tree(tmp_path, body)
    path = "tests/integration/test_x.py"
    done = subprocess.run(["bash", str(script), path], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stdout + done.stderr
    assert (ran.read_text().split() if ran.exists() else []) == runs.split()
