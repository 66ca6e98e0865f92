"""Any message, and the vendors' tool calls, a part of each twin (:class:`Vendor`, :class:`AsyncVendor`).

What these answer is the wire's JSON (``request``, ``act``: any message's reply) or the vendor's own
(a ``tool_result`` block, a Responses input item): open-ended, so it is answered as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

from corral.client import Envelope, Frame
from corral.sdk.connection import AsyncConnected, Connected
from corral.sdk.messages import messages
from corral.tool_calls import ModelReply, OnError, Vendored


class Vendor(Connected):
    """Any message, and the vendors' tool calls: what these answer is the wire's or the vendor's own
    JSON (open-ended), so they answer it as it is."""

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return self._send(messages.request(message))

    def act(self, action: Mapping[str, Any], **envelope: Unpack[Envelope]) -> Frame:
        """A native action; its whole reply (``result``, and the ``screenshot`` an envelope asked
        for); raises :class:`ActionFailed` on an error reply."""
        return self._send(messages.act(action, envelope))

    def run_anthropic(
        self, tool_input: Mapping[str, Any], display: tuple[int, int] | None = None
    ) -> list[dict[str, Any]]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return self._send(messages.anthropic(tool_input, display))

    def run_openai(
        self, action: Mapping[str, Any] | list[Mapping[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return self._send(messages.openai(action, display))

    def anthropic(
        self,
        block: Vendored,
        *,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Unpack[Envelope],
    ) -> dict[str, Any]:
        """The ``tool_result`` block for one Messages ``tool_use`` block (a dict or the SDK's object), ready
        to send back; a failed call's is ``is_error`` with the reason, and ``on_error`` hears Corral's
        error. ``display``: the size the computer tool declared, when it is not the screen's."""
        return self._send(messages.anthropic_block(block, display, envelope, on_error))

    def openai(
        self,
        item: Vendored,
        *,
        acknowledge_safety_checks: bool = False,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Unpack[Envelope],
    ) -> dict[str, Any]:
        """The input item for one Responses output item (``computer_call``, ``shell_call``,
        ``local_shell_call``, ``apply_patch_call``; a dict or the SDK's object), ready to send back; a
        failed call's in the vendor's error form, and ``on_error`` hears Corral's error.
        ``acknowledge_safety_checks``: a ``computer_call``'s pending checks are acknowledged in the output."""
        return self._send(messages.openai_item(item, display, acknowledge_safety_checks, envelope, on_error))

    def tool_results(
        self,
        reply: ModelReply,
        *,
        display: tuple[int, int] | None = None,
        acknowledge_safety_checks: bool = False,
        on_error: OnError | None = None,
    ) -> list[dict[str, Any]]:
        """The results of every tool call of a whole model reply, in order: a Messages reply's
        ``tool_use`` blocks (the list is the next user message's ``content``) or a Responses reply's
        served output items (the next request's ``input``). ``BetaMessage``/``Response`` or dicts."""
        calls = messages.tool_results(reply, display, acknowledge_safety_checks, on_error)
        return [self._send(message) for message in calls]


class AsyncVendor(AsyncConnected):
    """The async twin of :class:`Vendor`."""

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Any message; its reply as it came (``ok`` true or false)."""
        return await self._send(messages.request(message))

    async def act(self, action: Mapping[str, Any], **envelope: Unpack[Envelope]) -> Frame:
        """A native action; its whole reply (``result``, and the ``screenshot`` an envelope asked
        for); raises :class:`ActionFailed` on an error reply."""
        return await self._send(messages.act(action, envelope))

    async def run_anthropic(
        self, tool_input: Mapping[str, Any], display: tuple[int, int] | None = None
    ) -> list[dict[str, Any]]:
        """The content of the ``tool_result`` for one computer-tool call."""
        return await self._send(messages.anthropic(tool_input, display))

    async def run_openai(
        self, action: Mapping[str, Any] | list[Mapping[str, Any]], display: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The ``computer_call_output.output`` for one computer call (an action or a batch)."""
        return await self._send(messages.openai(action, display))

    async def anthropic(
        self,
        block: Vendored,
        *,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Unpack[Envelope],
    ) -> dict[str, Any]:
        """The ``tool_result`` block for one Messages ``tool_use`` block (a dict or the SDK's object), ready
        to send back; a failed call's is ``is_error`` with the reason, and ``on_error`` hears Corral's
        error. ``display``: the size the computer tool declared, when it is not the screen's."""
        return await self._send(messages.anthropic_block(block, display, envelope, on_error))

    async def openai(
        self,
        item: Vendored,
        *,
        acknowledge_safety_checks: bool = False,
        display: tuple[int, int] | None = None,
        on_error: OnError | None = None,
        **envelope: Unpack[Envelope],
    ) -> dict[str, Any]:
        """The input item for one Responses output item (``computer_call``, ``shell_call``,
        ``local_shell_call``, ``apply_patch_call``; a dict or the SDK's object), ready to send back; a
        failed call's in the vendor's error form, and ``on_error`` hears Corral's error.
        ``acknowledge_safety_checks``: a ``computer_call``'s pending checks are acknowledged in the output."""
        return await self._send(messages.openai_item(item, display, acknowledge_safety_checks, envelope, on_error))

    async def tool_results(
        self,
        reply: ModelReply,
        *,
        display: tuple[int, int] | None = None,
        acknowledge_safety_checks: bool = False,
        on_error: OnError | None = None,
    ) -> list[dict[str, Any]]:
        """The results of every tool call of a whole model reply, in order: a Messages reply's
        ``tool_use`` blocks (the list is the next user message's ``content``) or a Responses reply's
        served output items (the next request's ``input``). ``BetaMessage``/``Response`` or dicts."""
        calls = messages.tool_results(reply, display, acknowledge_safety_checks, on_error)
        return [await self._send(message) for message in calls]
