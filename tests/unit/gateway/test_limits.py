"""Default limits sized to the host, with the host's facts injected."""

from __future__ import annotations

from pathlib import Path

from corral.gateway.limits import MIN_MEMORY_MB, HostFacts, resolve
from corral.gateway.settings import GatewaySettings


def _settings(**values: object) -> GatewaySettings:
    return GatewaySettings(**{"max_sessions": 8, "pool_size": 1, **values})  # type: ignore[arg-type]


def test_one_session_never_takes_every_core_by_default() -> None:
    for cores, expected in ((1, 0.5), (2, 1.5), (3, 2.0), (64, 2.0)):
        limits = resolve(_settings(), HostFacts(cores, 64 << 10))
        assert limits.cpus == expected and limits.cpus < cores
        assert limits.fits_host


def test_an_operator_setting_that_takes_every_core_is_kept_and_said() -> None:
    limits = resolve(_settings(default_cpus=2.0), HostFacts(2, 64 << 10))
    assert limits.cpus == 2.0
    assert not limits.fits_host and "all 2 cores" in limits.warnings[0]


def test_memory_defaults_fit_the_sessions_at_the_cap() -> None:
    roomy = resolve(_settings(), HostFacts(8, 64 << 10))
    assert roomy.memory_mb == 1536 and roomy.fits_host
    # 16 GiB, 2 GiB kept for the host: 9 pairs (8 sessions and the pool) share 14 GiB, proxies included.
    tight = resolve(_settings(), HostFacts(8, 16 << 10))
    assert tight.memory_mb == 14336 // 9 - 512
    assert tight.committed_mb <= (tight.available_mb or 0) and tight.fits_host
    without_egress = resolve(_settings(egress=False), HostFacts(8, 16 << 10))
    assert without_egress.memory_mb == 1536  # no proxies: the full default fits


def test_a_host_too_small_for_the_cap_is_said_at_start() -> None:
    limits = resolve(_settings(), HostFacts(2, 4 << 10))
    assert limits.memory_mb == MIN_MEMORY_MB  # never starved below what Chromium needs
    assert not limits.fits_host
    assert "CORRAL_MAX_SESSIONS" in limits.warnings[0] and "3072 MiB" in limits.warnings[0]
    health = limits.health()
    assert health["fits_host"] is False and health["host_memory_mb"] == 4096 and health["warnings"]
    explicit = resolve(_settings(default_memory_mb=4096, max_memory_mb=8192), HostFacts(2, 24 << 10))
    assert explicit.memory_mb == 4096 and not explicit.fits_host


def test_host_facts_are_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683584 kB\nMemFree:         1000 kB\n")
    assert HostFacts.detect(meminfo).memory_mb == 24683584 // 1024
    assert HostFacts.detect(tmp_path / "missing").memory_mb is None
    unknown = resolve(_settings(), HostFacts(4, None))
    assert unknown.memory_mb == 1536 and unknown.fits_host  # nothing to check against
