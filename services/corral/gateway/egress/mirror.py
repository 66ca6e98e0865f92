"""The gateway's copy of each proxy's audit log and recorded responses, where the runtime shares no
directory with the proxy (``SandboxRuntime.shares_proxy_state`` False: a proxy on another node).

The proxy keeps its state on its own tmpfs; the gateway reads it over the control channel
(:class:`~corral.contracts.control.ReadState`, gateway role, at most 256 KiB a read) into the
session's state directory, where every reader (traffic, HAR, anchors, recordings, the archive)
finds it as it always did. It follows each live proxy on the reaper's tick, before a read of the
audit, and a last time at teardown (after the end anchor, before the proxy goes), so a node that is
lost leaves the audit up to the last record received.

The copy only grows, and only by what the proxy's chain holds: each audit line is appended when it
is the record after the copy's last one (its ``prev``, its ``seq``, its own hash), never a line that
does not follow; the responses, a flow file the proxy only appends to, are appended as read. Both
are bounded (the audit by its budget and a margin, the responses by theirs). A proxy that shows a
line that does not follow, or more than the bound, is followed no further (said once, loudly); what
the copy holds stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.contracts.control import MAX_READ_BYTES, FileChunk, Head, ReadState, Reply, StateFile
from corral.errors import ControlError
from corral.gateway.settings import GatewaySettings
from corral.proxy import audit, control
from corral.proxy.audit import GENESIS, Link, bounded_lines, link_of
from corral.proxy.control import AUDIT_FILE, RESPONSES_FILE

from .channel import ProxyChannel
from .pairs import POLL_TIMEOUT_S, Egress
from .state import ProxyTokens

log = logging.getLogger(__name__)

# Reads a pass takes at most (8 MiB): a tick never waits long on one proxy; a final pass takes all
# there can be (the copies' bounds in whole reads, twice over), never more: the proxy says how long
# its file is, and a compromised one says it never ends.
CHUNKS_PER_PASS = 32
# A pass's time, whatever the proxy does (answers slowly, a byte at a time): the tick's egress round
# waits on its passes, a teardown on its final one.
PASS_S = 10.0
FINAL_PASS_S = 120.0
# Past the audit's budget a proxy still writes its budget record and tallies: room for them.
AUDIT_MARGIN_BYTES = 16 << 20
# Whole lines read that no head vouched for yet (a proxy's head is read with each chunk, so only a
# writer beside the proxy makes these many).
MAX_HELD_BYTES = 16 << 20
MAX_VOUCHED = 1024  # heads and marks past the copy, kept until the copy reaches them


@dataclass(slots=True)
class AuditCopy:
    """The gateway's copy of a proxy's audit log: where its chain ends (``seq``, ``hash``), where the
    next read starts in the proxy's file (``remote``), the whole lines read and not yet vouched for
    (``held``), a line begun (``partial``), and the last head the proxy vouched for from its memory."""

    path: Path
    size: int = 0
    seq: int = 0
    hash: str = GENESIS
    remote: int = 0
    partial: bytes = b""
    held: list[Link] = field(default_factory=list)
    vouched: dict[str, int] = field(default_factory=dict)  # hash -> seq of heads and marks past the copy
    dropped: int = 0  # lines read that were no link of the vouched chain (a forger's, or garbage)
    broken: str | None = None

    @classmethod
    def of(cls, path: Path) -> AuditCopy:
        """The copy as it is on disk (its chain walked once; a copy that is not one is followed no
        further). The next read starts at its size: lines read again are no links past its head."""
        copy = cls(path)
        try:
            with path.open("rb") as existing:
                for line in bounded_lines(existing, lenient=True):
                    copy.size += len(line)
                    link = link_of(line)
                    if copy.broken is None and (link is None or (link.seq, link.prev) != (copy.seq + 1, copy.hash)):
                        copy.broken = f"the gateway's copy is no chain at seq {copy.seq + 1}"
                    elif link is not None and copy.broken is None:
                        copy.seq, copy.hash = link.seq, link.hash
        except FileNotFoundError:
            pass
        copy.remote = copy.size
        return copy

    def take(self, data: bytes, head: Head | None, marks: tuple[Head, ...] = ()) -> bytes:
        """``data``, read at :attr:`remote`, with the head the proxy's memory held as it read it and
        its marks past the copy's seq: the lines to append (pure). Only the chain that leads from the
        copy's head to the furthest vouched one held is taken, in its order; a line of no such chain
        (another writer's) is dropped, never appended."""
        buffer = self.partial + data
        cut = buffer.rfind(b"\n") + 1
        whole, self.partial = buffer[:cut], buffer[cut:]
        self.remote += len(data)
        for line in whole.splitlines(keepends=True):
            link = link_of(line)
            if link is None:
                self.dropped += bool(line.strip())
            elif link.seq > self.seq:
                self.held.append(link)
        for vouched in (*marks, *((head,) if head is not None else ())):
            if vouched.seq > self.seq and len(self.vouched) < MAX_VOUCHED:
                self.vouched[vouched.hash] = vouched.seq
        taken = self._vouched_chain()
        if len(self.partial) > audit.MAX_LINE_BYTES:
            self.broken = f"the proxy's record after seq {self.seq} is longer than any audit record"
        elif sum(len(link.line) for link in self.held) > MAX_HELD_BYTES:
            self.broken = f"the proxy wrote more than {MAX_HELD_BYTES} bytes its head does not vouch for"
        if self.broken is not None:
            self.partial, self.held = b"", []
        return taken

    def _vouched_chain(self) -> bytes:
        """The held links from the copy's head to the furthest vouched one held, walked back by ``prev``."""
        at = next((i for i in range(len(self.held) - 1, -1, -1) if self.held[i].hash in self.vouched), -1)
        if at < 0:
            return b""  # none read yet: held until one is
        target = Head(self.vouched[self.held[at].hash], self.held[at].hash)
        by_hash = {link.hash: link for link in self.held[: at + 1]}
        chain: list[Link] = []
        wanted = target.hash
        while wanted != self.hash:
            link = by_hash.get(wanted)
            if link is None or len(chain) > len(by_hash):
                self.broken = f"the proxy's head (seq {target.seq}) does not follow the copy's (seq {self.seq})"
                return b""
            chain.append(link)
            wanted = link.prev
        chain.reverse()
        if [link.seq for link in chain] != list(range(self.seq + 1, target.seq + 1)):
            self.broken = f"the proxy's chain to seq {target.seq} skips or repeats a sequence number"
            return b""
        self.dropped += at + 1 - len(chain)
        self.held = self.held[at + 1 :]
        self.seq, self.hash = target.seq, target.hash
        self.vouched = {h: seq for h, seq in self.vouched.items() if seq > self.seq}
        taken = b"".join(link.line for link in chain)
        self.size += len(taken)
        return taken


@dataclass(slots=True)
class ResponsesCopy:
    """The gateway's copy of a proxy's recorded responses (a flow file it only appends to)."""

    path: Path
    size: int = 0
    remote: int = 0  # where the next read starts in the proxy's file
    broken: str | None = None

    @classmethod
    def of(cls, path: Path) -> ResponsesCopy:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        return cls(path, size, size)  # the proxy's file, as far as the copy goes


@dataclass(slots=True)
class Copies:
    audit: AuditCopy
    responses: ResponsesCopy
    lock: threading.Lock = field(default_factory=threading.Lock)  # one pass per session at a time


class StateMirror:
    """Follows each live proxy's audit log and responses into its state directory (``active``: the
    runtime shares none with the proxy; otherwise every call does nothing)."""

    def __init__(self, settings: GatewaySettings, tokens: ProxyTokens, channel: ProxyChannel, active: bool) -> None:
        self.active = active
        self._tokens = tokens
        self._channel = channel  # its control port (a test's may differ)
        self._audit_cap = settings.audit_max_bytes + AUDIT_MARGIN_BYTES
        self._responses_cap = (settings.responses_max_total_mb + settings.responses_max_body_mb) << 20
        self._copies: dict[str, Copies] = {}
        self._guard = threading.Lock()  # over _copies (passes run in worker threads)
        self._clock: Callable[[], float] = time.monotonic
        self._gates: dict[str, asyncio.Lock] = {}  # the event loop's passes, one per session at a time

    def final_chunks(self, cap: int) -> int:
        """The reads a final pass of a file bounded by ``cap`` takes at most."""
        return 2 * (cap // MAX_READ_BYTES + 1) + CHUNKS_PER_PASS

    async def follow(self, egress: Egress, wait: bool = False) -> None:
        """One pass: from a tick (a pass already under way for the proxy stands for it) or, ``wait``,
        before a read (after the pass under way, if any). The waiting is the event loop's: a worker
        thread is taken only for a pass that runs (reads polling a session whose proxy is slow, or
        whose node is cut off, would otherwise hold every thread of the gateway's pool)."""
        if not self.active:
            return
        gate = self._gates.setdefault(egress.session_id, asyncio.Lock())
        if gate.locked() and not wait:
            return
        async with gate:
            await asyncio.to_thread(self.follow_blocking, egress, False, wait)

    def follow_blocking(self, egress: Egress, final: bool = False, wait: bool = False) -> None:
        """One pass, bounded by :data:`CHUNKS_PER_PASS` (``final``: until the copy reaches the proxy's
        file, the last before the proxy goes, after a pass under way). Never raises: a proxy that
        does not answer is said in the log and the copy stays as it is."""
        if not self.active:
            return
        copies = self._of(egress)
        if not copies.lock.acquire(blocking=final or wait):
            return
        deadline = self._clock() + (FINAL_PASS_S if final else PASS_S)
        try:
            chunks = self.final_chunks(self._audit_cap + MAX_HELD_BYTES) if final else CHUNKS_PER_PASS
            self._follow_audit(egress, copies.audit, chunks, deadline)
            # A hermetic proxy keeps none: its file reads as empty.
            chunks = self.final_chunks(self._responses_cap) if final else CHUNKS_PER_PASS
            self._follow_responses(egress, copies.responses, chunks, deadline)
        except ControlError as exc:
            level = logging.WARNING if final else logging.DEBUG
            log.log(level, "cannot mirror the egress state of %s: %s", egress.session_id, exc)
        except Exception:  # what the proxy sent that no check foresaw: the teardown and the round go on
            log.exception("mirroring the egress state of %s failed", egress.session_id)
        finally:
            copies.lock.release()

    def forget(self, session_id: str) -> None:
        with self._guard:
            self._copies.pop(session_id, None)
            self._gates.pop(session_id, None)

    def restarted(self, session_id: str) -> None:
        """The session's proxy started again, seeded from the copy (its audit file is the copy's
        bytes, its responses a file of its own): followed on from the copy as it is on disk, never
        from where the old proxy's reads had got to (past the copy when its last lines were read and
        not vouched, or dropped: the new file is refused there, or cut mid-record)."""
        self.forget(session_id)

    def _of(self, egress: Egress) -> Copies:
        with self._guard:
            copies = self._copies.get(egress.session_id)
            if copies is None:
                state = Path(egress.state_dir)
                copies = Copies(AuditCopy.of(state / AUDIT_FILE), ResponsesCopy.of(state / RESPONSES_FILE))
                self._copies[egress.session_id] = copies
            return copies

    def _follow_audit(self, egress: Egress, copy: AuditCopy, chunks: int, deadline: float) -> None:
        while copy.broken is None and chunks > 0 and self._clock() < deadline:
            if copy.remote > self._audit_cap + MAX_HELD_BYTES:
                copy.broken = f"the proxy's audit file is past {self._audit_cap + MAX_HELD_BYTES} bytes"
                log.error("egress audit of %s is mirrored no further: %s", egress.session_id, copy.broken)
                return
            chunk, reply = self._read(egress, "audit", copy.remote, copy.seq)
            dropped = copy.dropped
            taken = copy.take(chunk.data, reply.head, reply.marks or ())
            if copy.size > self._audit_cap:  # the records that fit, then no more: the copy keeps its bound
                copy.broken = f"the proxy's audit log is past {self._audit_cap} bytes"
                taken = _lines_within(taken, self._audit_cap - (copy.size - len(taken)))
            _append(copy.path, taken)
            if copy.dropped > dropped:
                log.error(
                    "egress audit of %s: %d lines that are no records of its chain were left out",
                    egress.session_id,
                    copy.dropped - dropped,
                )
            if copy.broken is not None:
                log.error("egress audit of %s is mirrored no further: %s", egress.session_id, copy.broken)
            if not chunk.data or copy.remote >= chunk.size:
                return
            chunks -= 1

    def _follow_responses(self, egress: Egress, copy: ResponsesCopy, chunks: int, deadline: float) -> None:
        while copy.broken is None and chunks > 0 and self._clock() < deadline:
            chunks -= 1
            try:
                chunk, _ = self._read(egress, "responses", copy.remote)
            except ControlError as exc:
                if exc.field != "offset" or copy.remote == 0:
                    raise
                # Shorter than the copy: a proxy started again, on a file of its own; it follows on.
                log.warning(
                    "the egress proxy of %s started its responses afresh: mirrored after the copy", egress.session_id
                )
                copy.remote = 0
                continue
            if copy.size + len(chunk.data) > self._responses_cap:
                copy.broken = f"the proxy's responses are past {self._responses_cap} bytes"
                log.error("egress responses of %s are mirrored no further: %s", egress.session_id, copy.broken)
                return
            _append(copy.path, chunk.data)
            copy.size += len(chunk.data)
            copy.remote += len(chunk.data)
            if not chunk.data or copy.remote >= chunk.size:
                return

    def _read(self, egress: Egress, file: StateFile, offset: int, after: int = 0) -> tuple[FileChunk, Reply]:
        """A chunk of the proxy's file, and its answer (the audit's: the chain's head and its marks
        past ``after``, from the proxy's memory)."""
        token = self._tokens.token(egress.session_id)
        message = ReadState(file, offset, after=after)
        try:
            reply = control.call_blocking(
                egress.proxy_address, self._channel.control_port, token, message, POLL_TIMEOUT_S
            )
        except ValueError as exc:  # an answer the typed Reply cannot read
            raise ControlError(f"egress proxy gave a malformed answer: {exc}") from None
        chunk = reply.chunk
        if chunk is None or chunk.file != file or chunk.offset != offset:
            raise ControlError(f"egress proxy answered a read of its {file} at {offset} with something else")
        return chunk, reply


def _lines_within(data: bytes, room: int) -> bytes:
    """The whole lines at the start of ``data`` that fit in ``room`` bytes."""
    return data[: data.rfind(b"\n", 0, max(room, 0)) + 1]


def _append(path: Path, data: bytes) -> None:
    """``data`` at the end of ``path`` (0600 when made: the state directory is the gateway's)."""
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
