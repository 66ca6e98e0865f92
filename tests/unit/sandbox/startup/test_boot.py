"""The sandbox's root stage: the firewall it sets, the policies it writes, how it drops privileges."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from corral.contracts import auth
from corral.sandbox.display import xaccess
from corral.sandbox.startup import boot
from corral.sandbox.startup.init import chromium_argv, egress_flags


def test_firewall_allows_only_loopback_the_proxy_and_the_gateway_to_the_controller() -> None:
    rules = boot.firewall_rules("172.30.5.0/24", "172.30.5.1", [8080, 8081], FENCED).splitlines()
    assert rules[0] == "*filter" and rules[-1] == "COMMIT"
    assert ":OUTPUT DROP [0:0]" in rules and ":INPUT DROP [0:0]" in rules and ":FORWARD DROP [0:0]" in rules
    accepts = [r for r in rules if r.startswith("-A OUTPUT") and r.endswith("ACCEPT")]
    assert accepts == [
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A OUTPUT -p tcp -d 172.30.5.0/24 -m multiport --dports 8080,8081 -j ACCEPT",
    ]
    # The host's address on the bridge is refused before the subnet's proxy ports are allowed.
    host_rule = rules.index("-A OUTPUT -d 172.30.5.1/32 -j REJECT --reject-with icmp-admin-prohibited")
    assert host_rule < rules.index(accepts[2])
    assert "-A INPUT -p tcp -s 172.30.5.1/32 --dport 8765 -j ACCEPT" in rules


@pytest.mark.parametrize(
    ("network", "gateway"), [("172.30.5.0/24", "10.0.0.1"), ("not-a-net", "172.30.5.1"), ("172.30.5.0/24", "x")]
)
def test_firewall_refuses_nonsense(network: str, gateway: str) -> None:
    with pytest.raises(ValueError):
        boot.firewall_rules(network, gateway, [8080], FENCED)


def test_chromium_policy_names_the_proxy_and_turns_the_side_doors_off() -> None:
    policy = boot.chromium_policy("corral-proxy:8080")
    assert policy["ProxySettings"] == {"ProxyMode": "fixed_servers", "ProxyServer": "http://corral-proxy:8080"}
    assert policy["QuicAllowed"] is False and policy["DnsOverHttpsMode"] == "off"
    assert policy["WebRtcIPHandling"] == "disable_non_proxied_udp"
    assert "ProxySettings" not in boot.chromium_policy(None)


def test_chromium_policy_saves_downloads_in_the_agents_folder_without_asking() -> None:
    for proxy in ("corral-proxy:8080", None):
        policy = boot.chromium_policy(proxy)
        assert policy["DownloadDirectory"] == "/home/agent/Downloads"
        assert policy["PromptForDownloadLocation"] is False


def test_chromium_keeps_no_password_or_form_data_a_person_types() -> None:
    policy = boot.chromium_policy(None)
    assert policy["PasswordManagerEnabled"] is False
    assert policy["AutofillAddressEnabled"] is False and policy["AutofillCreditCardEnabled"] is False


def test_chromium_policy_turns_chromiums_own_traffic_off() -> None:
    for proxy in ("corral-proxy:8080", None):
        policy = boot.chromium_policy(proxy)
        assert policy["BrowserSignin"] == 0 and policy["SyncDisabled"] is True
        assert policy["ComponentUpdatesEnabled"] is False and policy["ChromeVariations"] == 2
        assert policy["SafeBrowsingProtectionLevel"] == 0 and policy["MetricsReportingEnabled"] is False
        assert policy["BrowserNetworkTimeQueriesEnabled"] is False and policy["DomainReliabilityAllowed"] is False
        assert policy["SearchSuggestEnabled"] is False and policy["NetworkPredictionOptions"] == 2


def test_chromium_flags_say_the_same() -> None:
    argv = chromium_argv(1280, 800, "/tmp/p", egress_flags("corral-proxy:8080"))
    assert "--proxy-server=http://corral-proxy:8080" in argv and "--disable-quic" in argv
    assert "--force-webrtc-ip-handling-policy=disable_non_proxied_udp" in argv
    disable = [a for a in argv if a.startswith("--disable-features=")]
    assert len(disable) == 1 and "DnsOverHttps" in disable[0]  # Chromium honours only the last one
    assert egress_flags(None) == []


def test_the_agent_uid_is_kept_off_the_controller_devtools_and_the_control_channel_first() -> None:
    rules = boot.firewall_rules("172.30.5.0/24", "172.30.5.1", [8080, 8081], FENCED).splitlines()
    reject = (
        "-A OUTPUT -p tcp -m multiport --dports 8765,9222,8081 -m owner --uid-owner 1100"
        " -j REJECT --reject-with tcp-reset"
    )
    no_answer = "-A OUTPUT -p tcp --sport 8765 -m owner --uid-owner 1100 -j DROP"
    browser = [r.replace("--uid-owner 1100", "--uid-owner 1200") for r in (reject, no_answer)]
    outputs = [r for r in rules if r.startswith("-A OUTPUT")]
    devtools = "-A OUTPUT -p tcp --sport 9222 -m owner --uid-owner 1100 -j DROP"  # the agent never answers there
    # Before any ACCEPT, loopback's and established connections' included; the browser's uid likewise.
    assert outputs[:5] == [reject, no_answer, *browser, devtools]
    open_rules = boot.open_rules(FENCED).splitlines()
    assert ":OUTPUT ACCEPT [0:0]" in open_rules and ":INPUT ACCEPT [0:0]" in open_rules
    agents = (
        "-A OUTPUT -p tcp -m multiport --dports 8765,9222 -m owner --uid-owner 1100 -j REJECT --reject-with tcp-reset"
    )
    assert [r for r in open_rules if r.startswith("-A")] == [
        agents,
        no_answer,
        agents.replace("--uid-owner 1100", "--uid-owner 1200"),
        browser[1],
        devtools,
    ]
    for proxied in (True, False):
        v6 = boot.ipv6_rules(FENCED, proxied).splitlines()
        assert v6.index(no_answer) < v6.index("-A OUTPUT -o lo -j ACCEPT")


def test_the_supervisor_keeps_only_what_starting_children_as_another_uid_takes() -> None:
    argv = boot.drop_argv(["/usr/bin/tini", "--", "python"])
    assert argv[0] == "/usr/bin/setpriv" and argv[-3:] == ["/usr/bin/tini", "--", "python"]
    for flag in ("--reuid=corral", "--regid=corral", "--clear-groups", "--no-new-privs"):
        assert flag in argv
    for kind in ("--bounding-set", "--inh-caps", "--ambient-caps"):
        assert f"{kind}=-all,+setuid,+setgid,+setpcap" in argv


@pytest.mark.parametrize(("display", "number"), [(":0", 0), (":12.0", 12)])
def test_the_display_number(display: str, number: int) -> None:
    assert boot.display_number(display) == number


@pytest.mark.parametrize("display", ["host:0", ":x", ""])
def test_a_display_that_is_not_local_is_refused(display: str) -> None:
    with pytest.raises(ValueError, match="local display"):
        boot.display_number(display)


def test_the_supervisor_is_at_home_as_corral() -> None:
    env = boot.supervisor_env({"CORRAL_PROXY": "corral-proxy:8080", "HOME": "/root"}, "/home/corral")
    assert env["CORRAL_PROXY"] == "corral-proxy:8080"
    assert env["HOME"] == "/home/corral" and env["USER"] == "corral"


def test_lock_down_writes_policy_and_bundle_and_refuses_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boot, "RUN_DIR", tmp_path / "run")
    monkeypatch.setattr(boot, "BROWSER_LOCK", tmp_path / "run" / "browser.lock")  # RUN_DIR's, bound at import
    monkeypatch.setattr(boot, "CHROMIUM_POLICY", tmp_path / "run" / "policy.json")
    monkeypatch.setattr(boot, "CA_CERT", tmp_path / "run" / "ca.pem")
    certs = tmp_path / "certs"
    certs.mkdir()
    monkeypatch.setattr(boot, "SYSTEM_BUNDLE", certs / "ca-certificates.crt")
    pristine = tmp_path / "pristine.crt"
    pristine.write_text("-----BEGIN CERTIFICATE-----\nDEBIAN\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(boot, "PRISTINE_BUNDLE", pristine)
    monkeypatch.setattr(boot, "SECRET_DIR", tmp_path / "run" / "controller")
    monkeypatch.setattr(boot, "X11_DIR", tmp_path / "x11")
    monkeypatch.setattr(boot, "LAUNCHER_DIR", tmp_path / "run" / "launcher")
    monkeypatch.setattr(boot, "BROWSER_HOME", tmp_path / "browser")
    monkeypatch.setattr(boot, "XAUTH_DIR", tmp_path / "run" / "x11auth")
    # No firewall here (iptables-restore refuses, or is missing): a warning, not a failure.
    monkeypatch.setattr(boot, "_apply", _no_firewall)
    cert = "-----BEGIN CERTIFICATE-----\nSESSION\n-----END CERTIFICATE-----"
    boot.lock_down({"CORRAL_CA_CERT": cert}, USERS)
    secret_dir = tmp_path / "run" / "controller"
    assert stat.S_IMODE(secret_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((secret_dir / "secret").stat().st_mode) == 0o400
    first = auth.read_secret(secret_dir / "secret")
    assert stat.S_IMODE((tmp_path / "x11").stat().st_mode) == 0o1777
    assert stat.S_IMODE((tmp_path / "run" / "launcher").stat().st_mode) == 0o700  # the launcher's socket
    assert stat.S_IMODE((tmp_path / "browser").stat().st_mode) == 0o700  # Chromium's home and profile
    cookie = tmp_path / "run" / "x11auth" / "controller"  # the X server's trusted cookie: corral's alone
    assert stat.S_IMODE(cookie.stat().st_mode) == 0o400 and len(xaccess.cookie_of(cookie.read_bytes())) == 16
    assert json.loads((tmp_path / "run" / "policy.json").read_text())["QuicAllowed"] is False
    bundle = (certs / "ca-certificates.crt").read_text()
    assert "DEBIAN" in bundle and "SESSION" in bundle
    # Started by Corral's runtime, a sandbox whose agent uid cannot be fenced off does not start.
    with pytest.raises(RuntimeError, match="cannot be kept off the controller"):
        boot.lock_down({"CORRAL_INNER_BOUNDARY": "required"}, USERS)
    # Another boot, another secret (a restarted container's directory is written over).
    secret_dir.chmod(0o700)
    boot.lock_down({}, USERS)
    assert auth.read_secret(secret_dir / "secret") != first
    with pytest.raises(RuntimeError, match="nothing else"):
        key = "\n-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"
        boot.lock_down({"CORRAL_CA_CERT": cert + key}, USERS)
    with pytest.raises(RuntimeError, match="CORRAL_SESSION_NET"):
        boot.lock_down({"CORRAL_PROXY": "corral-proxy:8080"}, USERS)
    with pytest.raises(ValueError, match="host:port"):
        boot.lock_down({"CORRAL_PROXY": "corral-proxy"}, USERS)


USERS = boot.Users(os.getuid(), os.getgid(), "/home/corral", 1100, os.getuid(), os.getgid())
FENCED = boot.Fenced(1100, 1200)


def _no_firewall(command: str, rules: str) -> None:
    raise RuntimeError(f"{command} failed: no NET_ADMIN here")


def test_a_templates_seed_is_copied_as_the_agent_and_the_base_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = boot.Users(1000, 1000, "/home/corral", 1100, 1200, 1200)
    ran: list[tuple[list[str], dict[str, object]]] = []

    def run(argv: list[str], **options: object) -> object:
        ran.append((argv, options))
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(boot.subprocess, "run", run)
    boot.seed_agent_dirs(users, tmp_path / "seed")  # no seed: the base image
    assert ran == []
    (tmp_path / "seed" / "workspace").mkdir(parents=True)
    boot.seed_agent_dirs(users, tmp_path / "seed")
    ((argv, options),) = ran
    assert argv[:4] == ["cp", "-R", "--no-clobber", "--no-dereference"] and argv[-2:] == [
        f"{tmp_path}/seed/workspace/.",
        "/workspace/",
    ]
    assert (options["user"], options["group"], options["extra_groups"]) == (1100, 1100, [])  # never root


def _users_of_this_process() -> boot.Users:
    uid, gid = os.getuid(), os.getgid()
    return boot.Users(uid, gid, "/", uid + 1, uid + 2, gid)


def test_a_given_secret_is_kept_and_its_directory_made_the_controllers_alone(tmp_path: Path) -> None:
    """The swarm driver's secret (a Swarm secret file of the controller's, 0400) is used as it is."""
    directory = tmp_path / "controller"
    directory.mkdir(mode=0o755)
    secret = directory / auth.SECRET_FILE.name
    secret.write_text("given\n")
    secret.chmod(0o400)
    boot.given_secret(_users_of_this_process(), directory)
    assert secret.read_text() == "given\n"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o440, 0o404, 0o600 | 0o004])
def test_a_given_secret_another_uid_could_read_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "controller"
    directory.mkdir()
    secret = directory / auth.SECRET_FILE.name
    secret.write_text("given\n")
    secret.chmod(mode)
    with pytest.raises(RuntimeError, match="0400"):
        boot.given_secret(_users_of_this_process(), directory)


def test_a_missing_given_secret_stops_boot(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        boot.given_secret(_users_of_this_process(), tmp_path)


def test_lock_down_takes_the_given_secret_instead_of_making_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    monkeypatch.setattr(boot, "write_secret", lambda users, directory: made.append("made"))
    monkeypatch.setattr(boot, "given_secret", lambda users, directory: made.append("given"))
    monkeypatch.setattr(boot, "_apply", lambda command, rules: None)
    for name in ("RUN_DIR", "CHROMIUM_POLICY", "CA_CERT", "XAUTH_DIR", "LAUNCHER_DIR", "BROWSER_LOCK"):
        monkeypatch.setattr(boot, name, tmp_path / name.lower())
    monkeypatch.setattr(boot, "BROWSER_HOME", tmp_path / "browser")
    monkeypatch.setattr(boot, "X11_DIR", tmp_path / "x11")
    monkeypatch.setattr(boot, "PRISTINE_BUNDLE", tmp_path / "none")
    boot.lock_down({boot.SECRET_GIVEN: "1"}, _users_of_this_process())
    boot.lock_down({}, _users_of_this_process())
    assert made == ["given", "made"]


def test_tmpfs_mounts_still_roots_are_handed_to_their_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Swarm tmpfs takes no uid: boot chowns the mount point; one owned already, or no mount, is left."""
    chowned: list[tuple[str, int, int]] = []
    owners = {"/m/agent": 0, "/m/corral": 1000, "/m/plain": 0}
    monkeypatch.setattr(boot.os.path, "ismount", lambda path: path != "/m/plain")
    monkeypatch.setattr(boot.os, "lstat", lambda path: os.stat_result((0o40755, 0, 0, 0, owners[path], 0, 0, 0, 0, 0)))
    monkeypatch.setattr(boot.os, "chown", lambda path, uid, gid, follow_symlinks: chowned.append((path, uid, gid)))
    entries = {"agent": (1100, 1100), "corral": (1000, 1000)}
    monkeypatch.setattr(
        boot.pwd, "getpwnam", lambda user: type("E", (), {"pw_uid": entries[user][0], "pw_gid": entries[user][1]})
    )
    handed = boot.own_tmpfs_mounts({"/m/agent": "agent", "/m/corral": "corral", "/m/plain": "agent"})
    assert handed == ["/m/agent"] and chowned == [("/m/agent", 1100, 1100)]


def test_no_new_privileges_holds_for_this_process_and_its_children() -> None:
    """Run in a child (the flag is never undone): its status then says NoNewPrivs 1."""
    import subprocess
    import sys

    code = "from corral.sandbox.startup import boot; boot.no_new_privileges(); print(open('/proc/self/status').read())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "NoNewPrivs:\t1" in done.stdout


def test_both_families_rules_are_applied_and_a_failure_of_either_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[tuple[str, str]] = []
    broken: set[str] = set()

    def apply(command: str, rules: str) -> None:
        applied.append((command, rules))
        if command in broken:
            raise RuntimeError(f"{command} failed")

    monkeypatch.setattr(boot, "_apply", apply)
    monkeypatch.setattr(boot, "_apply_ipv6", lambda rules: apply("ip6tables-restore", rules))
    boot._apply_both("four", "six")
    assert sorted(applied) == [("ip6tables-restore", "six"), ("iptables-restore", "four")]
    broken.add("ip6tables-restore")
    with pytest.raises(RuntimeError, match="ip6tables-restore failed"):
        boot._apply_both("four", "six")
    broken.add("iptables-restore")  # both: IPv4's said first, and only once IPv6's has ended too
    applied.clear()
    with pytest.raises(RuntimeError, match=r"^iptables-restore failed"):
        boot._apply_both("four", "six")
    assert len(applied) == 2
