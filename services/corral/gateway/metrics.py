"""Prometheus metrics of one gateway (its own registry, so tests can run several gateways)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sessions = Gauge("corral_sessions", "Sessions by state", ["state"], registry=self.registry)
        self.claim = Histogram(
            "corral_session_claim_seconds",
            "Time to hand out a sandbox",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.action = Histogram(
            "corral_action_seconds",
            "Round trip of one action through the gateway",
            ["transport"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "corral_errors_total", "Error replies and refusals by code", ["code"], registry=self.registry
        )

    def claimed(self, source: str, seconds: float) -> None:
        self.claim.labels(source=source).observe(seconds)

    def render(self, counts: dict[str, int]) -> bytes:
        for state, value in counts.items():
            self.sessions.labels(state=state).set(value)
        return generate_latest(self.registry)
