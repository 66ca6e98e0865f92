"""A fresh machine's `scripts/corral up` (docs/design/0455-fresh-machine-up.md), its heavy steps faked:
the engine's install and the virtualenv's run side by side, and the engine's install keeps apt's, dpkg's
and needrestart's chatter out of the output (one `apt-get update`, one install)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
# How long a fake waits for its partner's mark before it gives up (the fakes meet within milliseconds).
MEET_S = 20


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)


def _waits_for(mark: Path) -> str:
    """Shell lines that wait (bounded) for ``mark`` to exist, exiting 3 when it never does."""
    return f"for _ in $(seq {MEET_S * 20}); do [ -e {mark} ] && break; sleep 0.05; done\n[ -e {mark} ] || exit 3\n"


def _corral_tree(tmp_path: Path, engine: str, venv: str) -> tuple[Path, dict[str, str]]:
    """A tree with scripts/corral, its ensure-docker and bootstrap running ``engine`` and ``venv``, and a
    ``docker`` on the PATH that has no engine to talk to."""
    shutil.copy(ROOT / "scripts" / "corral", tmp_path / "corral")
    (tmp_path / "scripts").mkdir()
    shutil.move(tmp_path / "corral", tmp_path / "scripts" / "corral")
    _executable(tmp_path / "scripts" / "ensure-docker", engine)
    _executable(tmp_path / "scripts" / "bootstrap", venv)
    _executable(tmp_path / ".venv" / "bin" / "corral", f'echo "corral $*" > {tmp_path}/ran\n')
    _executable(tmp_path / "bin" / "docker", "exit 1\n")
    return tmp_path / "scripts" / "corral", {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}


def test_up_installs_the_engine_and_the_virtualenv_side_by_side(tmp_path: Path) -> None:
    engine_started, venv_started = tmp_path / "engine.started", tmp_path / "venv.started"
    corral, env = _corral_tree(
        tmp_path,
        engine=f"touch {engine_started}\n" + _waits_for(venv_started),
        venv=f"touch {venv_started}\n" + _waits_for(engine_started),
    )
    done = subprocess.run([str(corral), "up"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "corral up\n"


def test_up_stops_when_the_engine_cannot_be_installed(tmp_path: Path) -> None:
    corral, env = _corral_tree(tmp_path, engine="exit 7\n", venv="exit 0\n")
    done = subprocess.run([str(corral), "up"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert not (tmp_path / "ran").exists()


def test_a_failed_virtualenv_waits_for_the_engines_install_to_end(tmp_path: Path) -> None:
    """No apt or dpkg is left running behind a failed command (a later run would find dpkg's lock held)."""
    failed, engine_done = tmp_path / "venv.failed", tmp_path / "engine.done"
    corral, env = _corral_tree(
        tmp_path,
        engine=_waits_for(failed) + f"touch {engine_done}\n",
        venv=f"touch {failed}\nexit 5\n",
    )
    done = subprocess.run([str(corral), "up"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 5
    assert engine_done.exists()
    assert not (tmp_path / "ran").exists()


def test_an_interrupted_up_waits_for_the_engines_install_to_end(tmp_path: Path) -> None:
    """^C while both run: the virtualenv's install stops, the engine's is waited for, as for a failure.
    A background job of a script ignores ^C, so apt and dpkg run on, and `up` must not return the
    prompt (or let a second `up` find dpkg's lock held) while they do."""
    venv_pid, venv_started, engine_started = (
        tmp_path / "venv.pid",
        tmp_path / "venv.started",
        tmp_path / "engine.started",
    )
    seen = tmp_path / "engine.saw"
    corral, env = _corral_tree(
        tmp_path,
        # Once the virtualenv's install is gone (reaped), whether `up` is still there to wait for it.
        engine=f"touch {engine_started}\n"
        + _waits_for(venv_pid)
        + f"for _ in $(seq {MEET_S * 20}); do kill -0 $(cat {venv_pid}) 2>/dev/null || break; sleep 0.05; done\n"
        + f'if kill -0 "$PPID" 2>/dev/null; then echo waited > {seen}; else echo left > {seen}; fi\n',
        venv=f"echo $$ > {venv_pid}\ntouch {venv_started}\n" + _waits_for(tmp_path / "never"),
    )
    running = subprocess.Popen([str(corral), "up"], env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        for mark in (venv_started, engine_started):
            for _ in range(MEET_S * 20):
                if mark.exists() or running.poll() is not None:
                    break
                subprocess.run(["sleep", "0.05"], check=True)
            assert mark.exists(), running.stderr.read() if running.poll() is not None else mark
        os.killpg(running.pid, signal.SIGINT)  # what a terminal's ^C does: the whole foreground group
        running.wait(timeout=MEET_S * 2)
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait()
        if running.stderr is not None:
            running.stderr.close()
    assert running.returncode == 130
    for _ in range(MEET_S * 20):  # the engine's fake writes its verdict as it ends
        if seen.exists():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert seen.read_text() == "waited\n"
    assert not (tmp_path / "ran").exists()


def test_commands_without_docker_install_no_engine(tmp_path: Path) -> None:
    corral, env = _corral_tree(tmp_path, engine=f"touch {tmp_path}/engine.started\n", venv="exit 0\n")
    done = subprocess.run([str(corral), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "engine.started").exists()
    assert (tmp_path / "ran").read_text() == "corral status\n"


# What apt, dpkg, debconf and needrestart print on a fresh machine: none of it may reach up's output.
NOISE = (
    "perl: warning: Setting locale failed.",
    "debconf: delaying package configuration, since apt-utils is not installed",
    "Scanning processes... [=====================]",
    "Progress: [ 40%] [##########..............]",
)


def _engine_machine(tmp_path: Path, install_code: int = 0) -> tuple[list[str], dict[str, str]]:
    """scripts/ensure-docker on a machine faked on the PATH: root, apt-get (recording its calls and the
    settings it ran with), no dockerd until apt installs docker.io, Compose already there."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    state.mkdir()
    noise = "".join(f"echo '{line}'\necho '{line}' >&2\n" for line in NOISE)
    _executable(
        bin_dir / "apt-get",
        f'echo "$* | NEEDRESTART_SUSPEND=${{NEEDRESTART_SUSPEND:-}} LC_ALL=${{LC_ALL:-}}'
        f' DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}}" >> {state}/apt\n'
        + noise
        + 'case " $* " in *" install "*)\n'
        + f"  [ {install_code} = 0 ] && cp {state}/dockerd {bin_dir}/; exit {install_code} ;;\nesac\n",
    )
    _executable(state / "dockerd", f"touch {state}/dockerd.up\n")  # what installing docker.io puts on the PATH
    _executable(bin_dir / "id", "echo 0\n")
    _executable(bin_dir / "pgrep", "exit 0\n")  # a dockerd runs: the script leaves its pid file alone
    _executable(
        bin_dir / "docker",
        'case "$1" in\n'
        "  compose) echo 'Docker Compose version v2'; exit 0 ;;\n"
        f"  info) [ -e {state}/dockerd.up ] ;;\n"
        "  version) echo 20.10.24 ;;\n"
        "esac\n",
    )
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "CORRAL_LOG_DIR": str(state)}
    env.pop("LC_ALL", None)
    return ["bash", str(ROOT / "scripts" / "ensure-docker")], env


def test_the_engines_install_is_quiet_and_needs_one_apt_update(tmp_path: Path) -> None:
    command, env = _engine_machine(tmp_path)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert not [line for line in NOISE if line in output]
    assert output.splitlines()[-1] == "[ensure-docker] docker ready: 20.10.24"
    calls = (tmp_path / "state" / "apt").read_text().splitlines()
    assert len(calls) == 2
    update, install = calls
    assert update.startswith("-qq -o Dpkg::Use-Pty=0 -o APT::Color=0 update |")
    packages = install.split(" | ")[0].split("--no-install-recommends ")[1].split()
    assert packages[:2] == ["docker.io", "debootstrap"]
    assert not {"needrestart", "git"} & set(packages)
    for call in calls:
        assert call.endswith("| NEEDRESTART_SUSPEND=1 LC_ALL=C DEBIAN_FRONTEND=noninteractive")
    # The chatter is kept in the log, for a failure's report.
    assert NOISE[0] in (tmp_path / "state" / "corral-ensure-docker.log").read_text()


def test_a_failed_package_install_shows_the_end_of_its_log(tmp_path: Path) -> None:
    command, env = _engine_machine(tmp_path, install_code=100)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 100
    assert "installing docker.io debootstrap" in done.stderr
    assert "failed (100); the end of" in done.stderr
    assert NOISE[2] in done.stderr
    assert not (tmp_path / "state" / "dockerd.up").exists()
