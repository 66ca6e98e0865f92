"""Egress control for sessions: the allowlist policy and the tamper-evident audit log.

The per-session mitmproxy sidecar (its container lives in proxy/): the pure parts here (policy,
hosts, vetting, audit and its record type, control), the mitmproxy addons that apply them to live
traffic in :mod:`corral.proxy.addons`, composed in :mod:`corral.proxy.load`.
"""
