"""The frame limits every hop agrees on (client, gateway, controller)."""

from __future__ import annotations

from typing import Final

# The largest message any hop carries whole: a WebSocket frame (client, gateway, controller) or an
# action body the gateway passes on. Up to it, a message over ``Limits.max_message_bytes`` is still
# read, to be answered with a structured error; past it the connection closes (1009) or 413.
MAX_FRAME_BYTES: Final = 16 << 20

# The largest CDP message either hop (client to gateway, gateway to controller) carries: a full-page
# screenshot or a large DOM snapshot is tens of MiB. The agent's channel keeps its own limit
# (MAX_FRAME_BYTES).
CDP_MAX_FRAME_BYTES: Final = 64 << 20
