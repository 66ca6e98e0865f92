"""The check's judges: configuration, environment, layers, paths, users, setuid files."""

from __future__ import annotations

from dataclasses import replace

from corral.gateway.templates import check
from corral.runtime import ImageInfo

BASE = ImageInfo(
    id="sha256:base",
    layers=("a", "b"),
    entrypoint=("python", "-P", "-m", "corral.sandbox.startup.boot"),
    cmd=None,
    user="root",
    healthcheck=("CMD", "python"),
    env=("PATH=/opt/corral/bin:/usr/bin", "DISPLAY=:0"),
    volumes=(),
    labels={},
    size=1,
)


def test_a_template_that_only_adds_passes() -> None:
    image = replace(BASE, id="sha256:t", layers=("a", "b", "c"), env=(*BASE.env, "GREETING=hi"))
    assert check.config_refusals(BASE, image) == [] and check.on_base(BASE, image)
    assert check.added_env(BASE.env, image.env) == {"GREETING": "hi"}


def test_a_new_entrypoint_user_or_healthcheck_is_refused() -> None:
    for change in ({"entrypoint": ("sh",)}, {"user": "agent"}, {"healthcheck": None}, {"cmd": ("x",)}):
        refusals = check.config_refusals(BASE, replace(BASE, **change))  # type: ignore[arg-type]
        assert len(refusals) == 1 and "changes" in refusals[0]


def test_the_boots_environment_is_the_bases() -> None:
    assert check.env_refusals(BASE.env, ("PATH=/evil:/usr/bin", "DISPLAY=:0")) == ["it changes the base's PATH"]
    refused = check.env_refusals(BASE.env, (*BASE.env, "LD_PRELOAD=/x.so", "PYTHONPATH=/x", "OK=1"))
    assert refused == [
        "its ENV sets LD_PRELOAD, which the sandbox's boot reads",
        "its ENV sets PYTHONPATH, which the sandbox's boot reads",
    ]


def test_a_template_on_an_older_base_is_not_on_the_current_one() -> None:
    assert not check.on_base(replace(BASE, layers=("a", "z")), replace(BASE, layers=("a", "b", "c")))
    assert not check.on_base(BASE, replace(BASE, layers=("a",)))


def test_chromiums_policy_and_launcher_settings_stay_the_bases() -> None:
    # Where a template could turn Chromium's own traffic back on: its managed policy, the launcher
    # script's settings (it sources /etc/chromium.d), the binary; and CORRAL_CHROMIUM_FLAGS.
    for path in ("/etc/chromium", "/etc/chromium.d", "/usr/lib/chromium", "/usr/bin/chromium"):
        assert path in check.CHECKED
    assert check.path_refusals({"/etc/chromium.d": "x"}, {"/etc/chromium.d": "y"})
    refused = check.env_refusals(BASE.env, (*BASE.env, "CORRAL_CHROMIUM_FLAGS=--enable-sync"))
    assert refused == ["its ENV sets CORRAL_CHROMIUM_FLAGS, which the sandbox's boot reads"]


def test_paths_and_setuid_files() -> None:
    assert check.path_refusals({"/opt/corral": "x"}, {"/opt/corral": "y"}) == [
        "it changes /opt/corral, which is the base's"
    ]
    assert check.setuid_refusals(["/usr/bin/su"], ["/usr/bin/su", "/usr/local/bin/x"]) == [
        "it adds the setuid or setgid file /usr/local/bin/x"
    ]


PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\ncorral:x:1000:1000::/home/corral:/bin/sh\n"
    "agent:x:1100:1100::/home/agent:/bin/sh\nbrowser:x:1200:1200::/tmp:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\ncorral:x:1000:\nagent:x:1100:browser\nbrowser:x:1200:\n"


def test_the_uid_split_is_kept_and_system_users_may_come() -> None:
    added = PASSWD + "_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n"
    assert check.users_refusals(PASSWD, added, GROUP, GROUP) == []
    agent_root = PASSWD.replace("agent:x:1100:1100", "agent:x:0:0")
    assert check.users_refusals(PASSWD, agent_root, GROUP, GROUP) == ["it changes the user agent"]
    twin = PASSWD + "twin:x:1000:1000::/:/bin/sh\n"
    assert check.users_refusals(PASSWD, twin, GROUP, GROUP) == [
        "its new user twin takes the number 1000 of one of the base's"
    ]
    out_of_group = GROUP.replace("agent:x:1100:browser", "agent:x:1100:browser,mallory")
    assert check.users_refusals(PASSWD, PASSWD, GROUP, out_of_group) == ["it changes the group agent"]


def test_what_runs_with_capabilities_is_found_by_a_path_the_check_keeps_the_bases() -> None:
    """A template once put /usr/local/sbin/setpriv (first on the image's PATH) and boot ran it as root
    with NET_ADMIN, the check none the wiser (the review of issue 29 built it and saw uid 0, CapEff
    0x31c1): boot and the supervisor now run these programs by the base's paths, and the check keeps them."""
    from corral.sandbox.startup import boot, init

    assert boot.SETPRIV == init.SETPRIV == "/usr/bin/setpriv" and boot.SETPRIV in check.CHECKED
    assert "/usr/local" not in boot.SYSTEM_PATH
    assert init.as_agent(["x"])[0] == init.as_controller(["x"])[0] == init.as_launcher(["x"])[0] == boot.SETPRIV
    assert boot.drop_argv(["x"])[0] == boot.SETPRIV
    for command in ("iptables-restore", "ip6tables-restore"):
        assert any(path in check.CHECKED for path in (f"/usr/sbin/{command}", f"/sbin/{command}"))
