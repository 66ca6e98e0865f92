"""The egress sidecar's mitmproxy: a master running only the addons the proxy uses, Corral's with them.

``mitmdump`` builds its master from ``mitmproxy.addons.default_addons()``, and the package that
defines it imports every addon mitmproxy has on its first import: LDAP (proxy authentication),
Flask, Werkzeug and Jinja (the mitm.it onboarding app), the exporters, the HAR writer. None of them
is used here (no such option is set), and together they were about 16 MiB of every sidecar (PSS,
56-60 against 43 MiB idle). This master loads ``mitmproxy.addons`` without running its
``__init__`` and imports the addons it runs one by one (docs/design/0440).

The chain is mitmdump's, with what does nothing for Corral left out, in mitmdump's order: the
egress addons (corral.proxy.load) stand where mitmdump's script loader stood, so every hook meets
them where it met them under ``-s load.py``. What is kept includes each check mitmdump makes by
default: ``block`` (no client from a public address), ``disable_h2c`` (no cleartext HTTP/2 upgrade
to smuggle a request past the checks), ``strip_dns_https_records`` and ``update_alt_svc`` (no
client steered around the proxy), ``errorcheck`` (a start with errors exits instead of serving).
Left out: the onboarding app (mitm.it, now refused as any other host not allowed), proxy and
upstream authentication, sticky auth and cookies, anticache and anticomp, blocklist, map local and
remote, modify body and headers, client playback, save, HAR, export, cut, comment, command history,
the browser starter, the flow dumper (``flow_detail`` 0 printed nothing) and the script loader with
its once-a-second poll of the script's mtime.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported at run time only once the addon index is kept out (without_addon_index)
    from mitmproxy import master


def without_addon_index() -> None:
    """``mitmproxy.addons`` in sys.modules as the package it is, its ``__init__`` not run: each addon
    imported by name imports that addon and what it needs, not all of them."""
    if "mitmproxy.addons" in sys.modules:
        return
    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is None or spec.submodule_search_locations is None:
        raise RuntimeError("mitmproxy is not installed")
    sys.modules["mitmproxy.addons"] = importlib.util.module_from_spec(spec)


class CorralAddons:
    """Addons as one with children (mitmproxy calls each hook on the children in order): the place
    of Corral's in the chain, and the egress addons themselves, registered together as mitmdump's
    script loader registers ``-s load.py``: every option of theirs declared before any is configured."""

    def __init__(self, name: str, addons: list[object]) -> None:
        self.name = name  # mitmproxy's name for it (each addon's is unique)
        self.addons = addons


def setoptions(argv: Sequence[str]) -> list[str]:
    """The ``--set name=value`` pairs of ``argv``, in order; anything else is refused."""
    pairs = []
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag != "--set" or not args or "=" not in args[0]:
            raise SystemExit(f"usage: python -m corral.proxy.leanmaster [--set name=value]...; not {flag!r}")
        pairs.append(args.pop(0))
    return pairs


def build(pairs: Sequence[str]) -> master.Master:
    """The master with its chain, Corral's addons configured with ``pairs`` (inside a running loop)."""
    without_addon_index()
    from mitmproxy import hooks, master, options
    from mitmproxy.addons import (
        block,
        core,
        disable_h2c,
        dns_resolver,
        errorcheck,
        next_layer,
        proxyserver,
        serverplayback,
        strip_dns_https_records,
        tlsconfig,
        update_alt_svc,
    )

    from corral.proxy.addons import Shared
    from corral.proxy.load import compose

    # mitmproxy.tools.main's logging: the termlog addon prints what its verbosity lets through.
    logging.getLogger().setLevel(logging.DEBUG)
    for name in ("asyncio", "hpack", "quic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    opts = options.Options()
    running = master.Master(opts, with_termlog=True)
    chain: Any = running.addons  # mitmproxy's AddonManager is untyped
    # Made first (its log handler goes in when made): an error logged while Corral's addons load and
    # configure below ends the start, as in mitmdump, where it is made before the script loads.
    errors = errorcheck.ErrorCheck()
    corral = CorralAddons("corral", [])
    chain.add(
        core.Core(),
        block.Block(),
        strip_dns_https_records.StripDnsHttpsRecords(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),  # type: ignore[no-untyped-call,unused-ignore]
        corral,  # where mitmdump's script loader stands
        dns_resolver.DnsResolver(),
        next_layer.NextLayer(),
        # Declares the server_replay_* options the hermetic playback reads; it replays nothing itself.
        serverplayback.ServerPlayback(),  # type: ignore[no-untyped-call,unused-ignore]
        tlsconfig.TlsConfig(),
        update_alt_svc.UpdateAltSvc(),
        errors,
    )
    # As mitmdump's script loader loads ``-s load.py`` once every addon of the chain is in: the
    # settings deferred (Corral's options are not declared yet), the addons registered together
    # (each option declared, then the deferred values set), then one configure with every key.
    opts.set(*pairs, defer=True)
    loaded = CorralAddons("corral.load", compose(Shared()))
    chain.register(loaded)
    corral.addons.append(loaded)
    keys: Any = opts.keys  # untyped in mitmproxy
    chain.invoke_addon_sync(loaded, hooks.ConfigureHook(set(keys())))
    if opts.deferred:
        raise SystemExit(f"unknown options: {', '.join(sorted(opts.deferred))}")
    return running


async def serve(pairs: Sequence[str]) -> None:
    running = build(pairs)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, running.shutdown)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a peer gone mid-write is that connection's error only
    await running.run()


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve(setoptions(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
