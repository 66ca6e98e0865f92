"""The control lease (a human's takeover), a part of each twin (:class:`Control`, :class:`AsyncControl`)."""

from __future__ import annotations

from corral.protocol.results import HandBack, LeaseAnswer
from corral.sdk.connection import AsyncConnected, Connected
from corral.sdk.messages import messages


class Control(Connected):
    """The control lease: a human's takeover through a viewer link (docs/protocol.md)."""

    @property
    def wait_for_control_ms(self) -> int:
        """How long each request waits while a human holds the control lease before failing with
        ``control_taken`` (0, the default: at once); a request's own ``wait_for_control_ms`` wins."""
        return self._wait_for_control_ms

    @wait_for_control_ms.setter
    def wait_for_control_ms(self, ms: int) -> None:
        self._wait_for_control_ms = ms

    def control(self, wait_ms: int = 0) -> LeaseAnswer:
        """Who holds the control lease (``holder``, ``since``, ``help``), and the human's hand-back
        (``handed_back``) if one waits, taken once; with ``wait_ms``, waits that long for a human
        holding it to hand it back."""
        return self._send(messages.control(wait_ms))

    def request_control(self, reason: str, *, wait_ms: int | None = None) -> LeaseAnswer:
        """Ask a human to step in (every viewer shows ``reason``) and wait for the hand-back (up to
        ``wait_ms``; the sandbox's default is 5 minutes): answers as :meth:`control`, with
        ``handed_back`` None when nobody came."""
        return self._send(messages.request_control(reason, wait_ms))

    @property
    def handed_back(self) -> HandBack | None:
        """The last reply's ``control`` member: a human handed the control lease back (``by``,
        ``note``, ``at``, ``left``), or None when that reply carried none. The sandbox sends each
        hand-back once, on the first reply after it (when :meth:`control` did not take it): read it
        after each call."""
        return self._handed_back


class AsyncControl(AsyncConnected):
    """The async twin of :class:`Control`: a human's takeover through a viewer link (docs/protocol.md)."""

    @property
    def wait_for_control_ms(self) -> int:
        """How long each request waits while a human holds the control lease before failing with
        ``control_taken`` (0, the default: at once); a request's own ``wait_for_control_ms`` wins."""
        return self._wait_for_control_ms

    @wait_for_control_ms.setter
    def wait_for_control_ms(self, ms: int) -> None:
        self._wait_for_control_ms = ms

    async def control(self, wait_ms: int = 0) -> LeaseAnswer:
        """Who holds the control lease (``holder``, ``since``, ``help``), and the human's hand-back
        (``handed_back``) if one waits, taken once; with ``wait_ms``, waits that long for a human
        holding it to hand it back."""
        return await self._send(messages.control(wait_ms))

    async def request_control(self, reason: str, *, wait_ms: int | None = None) -> LeaseAnswer:
        """Ask a human to step in (every viewer shows ``reason``) and wait for the hand-back (up to
        ``wait_ms``; the sandbox's default is 5 minutes): answers as :meth:`control`, with
        ``handed_back`` None when nobody came."""
        return await self._send(messages.request_control(reason, wait_ms))

    @property
    def handed_back(self) -> HandBack | None:
        """The last reply's ``control`` member: a human handed the control lease back (``by``,
        ``note``, ``at``, ``left``), or None when that reply carried none. The sandbox sends each
        hand-back once, on the first reply after it (when :meth:`control` did not take it): read it
        after each call."""
        return self._handed_back
