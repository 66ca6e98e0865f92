"""What ``mitmdump -s`` loads. mitmproxy runs a script as an anonymous module (not in
``sys.modules``), which breaks dataclasses under postponed annotations; so the addon lives in the
importable :mod:`corral.proxy.addon` and this file only hands it over."""

from corral.proxy.addon import addons

__all__ = ["addons"]
