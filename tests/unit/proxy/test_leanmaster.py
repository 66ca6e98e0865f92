"""The sidecar's master (corral.proxy.leanmaster): mitmdump's chain, in mitmdump's order, with the
addons Corral does not use left out and each of mitmdump's default checks kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy.addonmanager import _get_name
from mitmproxy.addons import default_addons
from mitmproxy.addons.errorcheck import ErrorCheck

from corral.proxy import leanmaster
from corral.proxy.addons import HermeticPlayback, PolicyGate
from corral.proxy.control import REPLAY_FILE

# What the egress proxy's security rests on beside its own addons (mitmdump's defaults).
KEPT_CHECKS = {"block", "disableh2c", "stripdnshttpsrecords", "updatealtsvc", "errorcheck", "tlsconfig"}
PAIRS = ["listen_host=127.0.0.1", "listen_port=0", "corral_mode=enforce", "corral_session=ses_1"]


def _errors(chain: list[object]) -> list[str]:
    """What was logged as an error while the master was built (mitmdump's errorcheck exits on any)."""
    check = next(addon for addon in chain if isinstance(addon, ErrorCheck))
    return [record.getMessage() for record in check.logger.has_errored]


def _chain(pairs: list[str]) -> list[object]:
    async def chain() -> list[object]:
        return list(leanmaster.build(pairs).addons.chain)

    return asyncio.run(chain())


def test_the_chain_is_mitmdumps_order_with_the_unused_addons_left_out() -> None:
    chain = _chain(PAIRS)
    names = [_get_name(addon) for addon in chain]
    assert set(names) >= KEPT_CHECKS
    assert not {"onboarding", "proxyauth", "scriptloader", "save", "dumper"} & set(names)
    # Corral's addons stand where mitmdump's script loader (and with it ``-s load.py``) stood.
    mitmdump = [_get_name(addon) for addon in default_addons()] + ["errorcheck"]
    at = mitmdump.index("scriptloader")
    mitmdump[at] = "corral"
    # Except the DNS resolver, which answers only a DNS mode's queries (the sidecar runs none): mitmdump
    # 11 (these tests) has it before the script loader, 12 (the image) after, where the master puts it.
    order = [name for name in mitmdump if name in names and name != "dnsresolver"]
    assert [name for name in names if name not in ("termlog", "dnsresolver")] == order


def test_corral_s_options_reach_its_addons_and_an_unknown_one_is_refused() -> None:
    chain = _chain(PAIRS)
    corral = next(addon for addon in chain if isinstance(addon, leanmaster.CorralAddons))
    (loaded,) = corral.addons
    assert isinstance(loaded, leanmaster.CorralAddons)
    assert any(isinstance(addon, PolicyGate) for addon in loaded.addons)
    assert _errors(chain) == []
    with pytest.raises(SystemExit, match="corral_no_such_option"):
        _chain([*PAIRS, "corral_no_such_option=1"])


def test_only_set_pairs_are_taken_from_the_command_line() -> None:
    assert leanmaster.setoptions(["--set", "a=1", "--set", "b=x=y"]) == ["a=1", "b=x=y"]
    for argv in (["-s", "load.py"], ["--set"], ["--set", "novalue"]):
        with pytest.raises(SystemExit):
            leanmaster.setoptions(argv)


def test_a_hermetic_proxy_finds_every_option_its_playback_reads(tmp_path: Path) -> None:
    """The server_replay_* options are mitmproxy's ServerPlayback's, later in the chain than Corral's
    addons: declared all the same before those are configured (else the start logs an error and exits)."""
    (tmp_path / REPLAY_FILE).write_bytes(b"")
    pairs = [*PAIRS, f"corral_state_dir={tmp_path}", "corral_hermetic=true", "connection_strategy=lazy"]
    chain = _chain(pairs)
    assert _errors(chain) == []
    corral = next(addon for addon in chain if isinstance(addon, leanmaster.CorralAddons))
    playback = next(addon for addon in corral.addons[0].addons if isinstance(addon, HermeticPlayback))  # type: ignore[attr-defined]
    assert playback.live.hermetic and playback.replay.error is None
