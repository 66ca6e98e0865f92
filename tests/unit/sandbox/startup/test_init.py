"""The sandbox init's pure helpers: the screen spec and Chromium's command line."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time

import pytest

from corral.sandbox.startup.init import CDP_PORT, Child, chromium_argv, screen_spec, start_after


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1280x800", (1280, 800, 24)),
        ("1280x800x24", (1280, 800, 24)),
        ("1920X1080", (1920, 1080, 24)),
        ("1024x768X24", (1024, 768, 24)),
        ("16x16", (16, 16, 24)),
        ("8192x8192", (8192, 8192, 24)),
        ("0800x0600", (800, 600, 24)),
    ],
)
def test_screen_spec(value: str, expected: tuple[int, int, int]) -> None:
    assert screen_spec(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must look like"),
        ("1280", "must look like"),
        ("1280x", "must look like"),
        ("x800", "must look like"),
        ("1280x800x24x1", "must look like"),
        ("1280*800", "must look like"),
        ("1280 x 800", "must look like"),
        (" 1280x800", "must look like"),
        ("-1280x800", "must look like"),
        ("1280.5x800", "must look like"),
        ("widexhigh", "must look like"),
        ("15x800", "unsupported screen"),
        ("1280x15", "unsupported screen"),
        ("8193x800", "unsupported screen"),
        ("1280x8193", "unsupported screen"),
        ("0x0", "unsupported screen"),
        ("1280x800x16", "unsupported screen"),
        ("1280x800x32", "unsupported screen"),
        ("1280x800x8", "unsupported screen"),
    ],
)
def test_screen_spec_rejects(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        screen_spec(value)


@pytest.fixture
def argv() -> list[str]:
    return chromium_argv(1280, 800, "/tmp/profile", [])


def test_chromium_argv_shape(argv: list[str]) -> None:
    assert argv[0] == "/usr/bin/chromium"  # the base's, never by PATH
    # No window and no URL at start: Chromium runs on without a window (it keeps itself alive with the
    # debugging port), and the controller opens the first page (corral.sandbox.web.pagekeeper).
    assert argv[-1] == "--no-startup-window"
    assert f"--remote-debugging-port={CDP_PORT}" in argv
    assert not any(arg.startswith(("about:", "http")) for arg in argv)
    assert len(argv) == len(set(argv))


@pytest.mark.parametrize(
    "flag",
    [
        "--remote-debugging-address=127.0.0.1",
        f"--remote-debugging-port={CDP_PORT}",
        "--user-data-dir=/tmp/profile",
        "--disable-quic",
        "--no-sandbox",
        "--test-type",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--force-device-scale-factor=1",
        "--window-position=0,0",
        "--window-size=1280,800",
        "--start-maximized",
        "--password-store=basic",
    ],
)
def test_chromium_argv_flags(argv: list[str], flag: str) -> None:
    assert flag in argv


def test_cdp_is_bound_to_loopback_only(argv: list[str]) -> None:
    addresses = [f for f in argv if f.startswith("--remote-debugging-address=")]
    assert addresses == ["--remote-debugging-address=127.0.0.1"]
    assert CDP_PORT == 9222


@pytest.mark.parametrize(("width", "height"), [(1024, 768), (1920, 1080), (16, 16)])
def test_chromium_window_size_follows_the_screen(width: int, height: int) -> None:
    argv = chromium_argv(width, height, "/p", [])
    sizes = [f for f in argv if f.startswith("--window-size=")]
    assert sizes == [f"--window-size={width},{height}"]


def test_extra_flags_go_before_no_startup_window() -> None:
    argv = chromium_argv(800, 600, "/data/profile", ["--lang=de", "--incognito"])
    assert argv[-3:] == ["--lang=de", "--incognito", "--no-startup-window"]
    assert "--user-data-dir=/data/profile" in argv


def test_chromiums_own_traffic_is_off_and_an_extra_flag_cannot_turn_it_back_on() -> None:
    from corral.sandbox.startup.init import INERT_URL, QUIET_FLAGS

    argv = chromium_argv(800, 600, "/p", ["--gaia-url=https://accounts.google.com", "--lang=de"])
    for flag in ("--disable-background-networking", "--disable-component-update", "--disable-domain-reliability"):
        assert flag in QUIET_FLAGS and flag in argv
    # Sign-in's account list and the component updater's on-demand installs, at a port Chromium
    # refuses to connect to: the extra's own gaia URL is dropped, Corral's stays the only one.
    assert [f for f in argv if f.startswith("--gaia-url")] == [f"--gaia-url={INERT_URL}"]
    assert f"--component-updater=url-source={INERT_URL}" in argv and INERT_URL == "http://127.0.0.1:1/"
    assert argv[-2:] == ["--lang=de", "--no-startup-window"]


def test_disabled_features(argv: list[str]) -> None:
    [features] = [f for f in argv if f.startswith("--disable-features=")]
    assert set(features.split("=", 1)[1].split(",")) >= {"Translate", "MediaRouter"}


def test_children_start_with_no_capability_and_the_agents_without_groups() -> None:
    from corral.sandbox.startup.init import as_agent, as_controller, can_switch_users, effective_caps

    assert as_controller(["Xvfb"]) == [
        "/usr/bin/setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--", "Xvfb"
    ]  # fmt: skip
    agent = as_agent(["chromium"])
    assert agent[:4] == ["/usr/bin/setpriv", "--reuid=agent", "--regid=agent", "--clear-groups"]
    assert "--no-new-privs" in agent and "--bounding-set=-all" in agent and agent[-2:] == ["--", "chromium"]
    status = "Name:\tpython\nCapInh:\t00000000000001c0\nCapEff:\t00000000000001c0\n"
    assert effective_caps(status) == 0x1C0 and can_switch_users(0x1C0)
    assert not can_switch_users(effective_caps("CapEff:\t00000000000000c0\n"))  # no SETPCAP: bounding set stays
    assert not can_switch_users(effective_caps("Name:\tx\n"))


def test_the_launcher_keeps_setuid_and_setgid_and_nothing_else() -> None:
    from corral.sandbox.startup.init import as_launcher

    keep = "-all,+setuid,+setgid"
    assert as_launcher(["python", "-m", "corral.sandbox.agent.launcher"]) == [
        "/usr/bin/setpriv", f"--inh-caps={keep}", f"--ambient-caps={keep}", f"--bounding-set={keep}",
        "--", "python", "-m", "corral.sandbox.agent.launcher",
    ]  # fmt: skip


def test_one_tab_memory_settings(argv: list[str]) -> None:
    [disabled] = [f for f in argv if f.startswith("--disable-features=")]
    [enabled] = [f for f in argv if f.startswith("--enable-features=")]
    assert {"PreloadTopChromeWebUI", "WebUIOmniboxPopup", "SpareRendererForSitePerProcess", "DnsOverHttps"} <= set(
        disabled.split("=", 1)[1].split(",")
    )
    assert "NetworkServiceInProcess2" in enabled.split("=", 1)[1].split(",")
    assert "--in-process-gpu" in argv
    assert "--no-zygote" not in argv  # measured: without zygotes each process shares less, PSS grew by 140 MiB


def test_the_playwright_driver_keeps_a_small_young_generation() -> None:
    from corral.sandbox.startup.init import DRIVER_NODE_OPTIONS

    assert DRIVER_NODE_OPTIONS.split() == ["--max-semi-space-size=1"]


def test_the_controller_holds_few_malloc_arenas() -> None:
    from corral.sandbox.startup.init import CONTROLLER_ENV, DRIVER_NODE_OPTIONS

    assert CONTROLLER_ENV == {"NODE_OPTIONS": DRIVER_NODE_OPTIONS, "MALLOC_ARENA_MAX": "2"}


def test_the_inits_lines_keep_the_controllers_format(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.sandbox.startup.stderrlog import StderrLog

    log = StderrLog("corral.init")
    log.warning("%s exited (%s) after %.1fs", "openbox", 1, 2.25)
    log.info("100% plain")  # no arguments: the text as it is, as logging has it
    try:
        raise ValueError("a bug")
    except ValueError:
        log.exception("the launcher goes on after a failure while %s", "testing")
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING corral.init: openbox exited \(1\) after 2.2s", lines[0]
    )
    assert lines[1].endswith(" INFO corral.init: 100% plain")
    assert lines[2].endswith(" ERROR corral.init: the launcher goes on after a failure while testing")
    assert lines[3] == "Traceback (most recent call last):" and lines[-1] == "ValueError: a bug"


def test_the_init_and_the_launcher_import_neither_logging_nor_dataclasses() -> None:
    # Each lives as long as its sandbox: those imports are about 2 MiB of every idle one (bench/gateway.py).
    for module in ("corral.sandbox.startup.init", "corral.sandbox.agent.launcher.server"):
        probe = f"import sys, {module}; print(sorted({{'logging', 'dataclasses', 'pathlib'}} & set(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "[]", module


def test_the_browser_runs_as_its_own_uid_in_the_agents_group_from_its_own_home() -> None:
    # The init (uid corral) cannot enter the browser's 0700 home: the change happens after setpriv.
    from corral.sandbox.startup.init import BROWSER_HOME, as_browser

    argv = as_browser(["openbox", "--sm-disable"])
    assert argv[:4] == ["/usr/bin/setpriv", "--reuid=browser", "--regid=browser", "--init-groups"]
    assert "--no-new-privs" in argv and "--bounding-set=-all" in argv
    assert argv[argv.index("--") + 1 :] == ["env", f"--chdir={BROWSER_HOME}", "--", "openbox", "--sm-disable"]


def test_xvfb_takes_only_the_cookie_and_never_resets() -> None:
    from corral.sandbox.startup.init import xvfb_auth_flags

    # A reset (its last client gone) would forget the browser's uid and the agent's untrusted cookie.
    assert xvfb_auth_flags("/run/corral/x11/controller") == ["-auth", "/run/corral/x11/controller", "-noreset"]


def test_openbox_says_on_its_stderr_when_it_has_announced_itself() -> None:
    from corral.sandbox.startup.init import OPENBOX_RC, OPENBOX_READY, openbox_argv

    argv = openbox_argv(OPENBOX_RC)
    assert argv[:4] == ["/usr/bin/openbox", "--sm-disable", "--config-file", OPENBOX_RC]
    assert openbox_argv(None)[:2] == ["/usr/bin/openbox", "--sm-disable"] and "--config-file" not in openbox_argv(None)
    # openbox splits its --startup command as a shell would and runs it; here, the same split, run.
    startup = shlex.split(argv[argv.index("--startup") + 1])
    assert startup[0] == "/usr/bin/sh"  # by the base's path, never by PATH
    done = subprocess.run(startup, capture_output=True, timeout=10, check=True)
    assert OPENBOX_READY in done.stderr and done.stdout == b""


class _Spawns:
    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []
        self.stopping = False

    def spawn(self, child: Child) -> None:
        self.started.append((child.name, time.monotonic()))


def test_chromium_starts_only_once_openbox_has_announced_itself(capsys: pytest.CaptureFixture[str]) -> None:
    sup, openbox, chromium = _Spawns(), Child("openbox", ["openbox"]), Child("chromium", ["chromium"])
    announced_at: list[float] = []

    def announce() -> None:
        time.sleep(0.3)
        announced_at.append(time.monotonic())
        openbox.ready.set()

    announcer = threading.Thread(target=announce)
    announcer.start()
    start_after(sup, openbox, chromium, wait_s=10)  # type: ignore[arg-type]
    announcer.join()
    assert [name for name, _ in sup.started] == ["chromium"] and sup.started[0][1] >= announced_at[0]
    assert sup.started[0][1] - announced_at[0] < 2  # at its announcement, not at the bound
    assert "did not announce" not in capsys.readouterr().err


def test_a_stop_while_openbox_is_awaited_starts_no_chromium() -> None:
    sup, openbox, chromium = _Spawns(), Child("openbox", ["openbox"]), Child("chromium", ["chromium"])
    threading.Timer(0.2, lambda: setattr(sup, "stopping", True)).start()
    started = time.monotonic()
    start_after(sup, openbox, chromium, wait_s=10)  # type: ignore[arg-type]
    assert sup.started == [] and time.monotonic() - started < 2


def test_a_window_manager_that_never_comes_up_delays_chromium_only_by_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sup, openbox, chromium = _Spawns(), Child("openbox", ["openbox"]), Child("chromium", ["chromium"])
    started = time.monotonic()
    start_after(sup, openbox, chromium, wait_s=0.2)  # type: ignore[arg-type]
    assert [name for name, _ in sup.started] == ["chromium"] and 0.2 <= time.monotonic() - started < 5
    warning = "WARNING corral.init: openbox did not announce itself within 0 s: chromium starts all the same"
    assert warning in capsys.readouterr().err
