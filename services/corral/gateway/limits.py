"""Default per-session limits sized to the host: one session never takes every core by default, and
the memory caps of a full gateway (every session and pooled pair, their proxies included) are
checked against the host's memory at start.

Pure but for :meth:`HostFacts.detect`, so tests inject the host they want.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.gateway.egress import PROXY_MEMORY_MB
from corral.gateway.settings import GatewaySettings

# What a sandbox gets when nothing says otherwise and the host has room: Chromium, Xvfb, the controller.
PREFERRED_MEMORY_MB = 1536
# Below this Chromium thrashes or is OOM-killed on ordinary pages: a derived default never goes lower.
MIN_MEMORY_MB = 768
# Two cores are what a cold start uses (Chromium and Python start CPU-bound); more buys nothing.
PREFERRED_CPUS = 2.0
MIN_CPUS = 0.5


@dataclass(frozen=True, slots=True)
class HostFacts:
    cpus: int
    memory_mb: int | None  # MemTotal; None when the host does not say

    @classmethod
    def detect(cls, meminfo: Path = Path("/proc/meminfo")) -> HostFacts:
        return cls(os.cpu_count() or 1, _mem_total_mb(meminfo))


def _mem_total_mb(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemTotal":
                return int(value.split()[0]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def reserve_mb(total_mb: int) -> int:
    """Memory left to the host itself, the gateway and the page cache: an eighth, at least 1 GiB."""
    return max(1024, total_mb // 8)


@dataclass(frozen=True, slots=True)
class Limits:
    """The defaults a session gets, and whether a full gateway fits the host."""

    cpus: float
    memory_mb: int
    host: HostFacts
    committed_mb: int  # memory caps of every session and pooled pair at the cap, proxies included
    available_mb: int | None  # the host's memory less its reserve
    warnings: tuple[str, ...] = field(default=())

    @property
    def fits_host(self) -> bool:
        return not self.warnings

    def health(self) -> dict[str, Any]:
        return {
            "default_cpus": self.cpus,
            "default_memory_mb": self.memory_mb,
            "host_cpus": self.host.cpus,
            "host_memory_mb": self.host.memory_mb,
            "committed_memory_mb": self.committed_mb,
            "available_memory_mb": self.available_mb,
            "fits_host": self.fits_host,
            "warnings": list(self.warnings),
        }


def resolve(settings: GatewaySettings, host: HostFacts) -> Limits:
    """The defaults for ``settings`` on ``host``: what the operator set, else derived from the host."""
    warnings: list[str] = []
    if settings.default_cpus is not None:
        cpus = settings.default_cpus
        if cpus >= host.cpus:
            warnings.append(f"CORRAL_DEFAULT_CPUS={cpus:g} lets one session take all {host.cpus} cores of this host")
    else:
        # Every core but half of one, at most two: one busy session never takes the whole host, and a
        # cold start keeps most of the burst it needs (measured on 2 cores, cold start p50: 1 CPU
        # 2.5-2.6 s, 1.5 CPUs 1.8-2.1 s, 2 CPUs 1.7-1.8 s; bench/gateway.py).
        cpus = max(MIN_CPUS, min(PREFERRED_CPUS, host.cpus - 0.5))
    cpus = min(cpus, settings.max_cpus)

    slots = settings.max_sessions + settings.pool_size  # the pool refills even at the session cap
    proxy_mb = PROXY_MEMORY_MB if settings.egress else 0
    available = None if host.memory_mb is None else host.memory_mb - reserve_mb(host.memory_mb)
    if settings.default_memory_mb is not None:
        memory = settings.default_memory_mb
    elif available is None:
        memory = PREFERRED_MEMORY_MB
    else:
        fair_share = available // slots - proxy_mb
        memory = max(MIN_MEMORY_MB, min(PREFERRED_MEMORY_MB, fair_share))
    memory = min(memory, settings.max_memory_mb)
    committed = slots * (memory + proxy_mb)
    if available is not None and committed > available:
        warnings.append(
            f"{settings.max_sessions} sessions and {settings.pool_size} pooled at {memory} MiB each"
            + (f" (+{proxy_mb} MiB for each proxy)" if proxy_mb else "")
            + f" may use {committed} MiB, more than the {available} MiB this host can give"
            f" ({host.memory_mb} MiB less {reserve_mb(host.memory_mb or 0)} MiB kept for the host);"
            " lower CORRAL_MAX_SESSIONS or CORRAL_DEFAULT_MEMORY_MB"
        )
    return Limits(cpus, memory, host, committed, available, tuple(warnings))
