"""Egress control for sessions: the allowlist policy and the tamper-evident audit log.

These are the pure parts of the per-session mitmproxy sidecar (its container lives in proxy/);
the mitmproxy addon that applies them to live traffic builds on this package.
"""
