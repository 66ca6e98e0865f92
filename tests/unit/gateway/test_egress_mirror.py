"""The gateway's mirror of a proxy's state (corral.gateway.egress.mirror), where the runtime shares no
directory with the proxy: the copy grows only by what the proxy's chain holds, bounded, and carries
on across a gateway restart. The proxy's side of a read is the real one (its file, its refusals);
only the socket is left out (``control.call_blocking``, the narrow seam). The real channel, over
real proxies: tests/integration/test_unshared_state.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from corral.contracts.control import Head, ReadState, Reply
from corral.errors import ControlError, InvalidMessage
from corral.gateway.egress import mirror as mirror_module
from corral.gateway.egress.mirror import AuditCopy, StateMirror
from corral.gateway.egress.pairs import Egress
from corral.gateway.egress.state import ProxyTokens
from corral.gateway.settings import GatewaySettings
from corral.proxy import audit
from corral.proxy.control import AUDIT_FILE, RESPONSES_FILE

SID = "ses_0123456789abcdef"


class ProxyFiles:
    """A proxy's own state directory as its channel reads it: at most ``chunk`` bytes a read (to cut
    records across reads), an offset past a file's end refused by field, as the addon refuses it."""

    def __init__(self, root: Path, chunk: int = 97) -> None:
        self.root = root
        self.chunk = chunk
        self.reads: list[ReadState] = []
        self.log: audit.AuditLog | None = None  # the proxy's own writer: its head is its memory's
        root.mkdir(parents=True, exist_ok=True)

    def open_log(self) -> audit.AuditLog:
        self.log = audit.AuditLog(self.root / AUDIT_FILE, SID)
        return self.log

    def call(self, host: str, port: int, token: str, message: object, timeout_s: float = 5.0) -> Reply:
        from corral.contracts.control import FileChunk, Head

        assert isinstance(message, ReadState)
        head = None
        if message.file == "audit" and self.log is not None:
            head = Head(self.log.head["seq"], self.log.head["hash"])
        self.reads.append(message)
        path = self.root / (AUDIT_FILE if message.file == "audit" else RESPONSES_FILE)
        data = path.read_bytes() if path.exists() else b""
        if message.offset > len(data):
            error = InvalidMessage("invalid_field", f"offset {message.offset} is past the end", "offset")
            raise ControlError(str(error), error.code, error.field)
        piece = data[message.offset : message.offset + min(self.chunk, message.limit)]
        marks = None
        if message.file == "audit" and self.log is not None:
            marks = tuple(Head(m["seq"], m["hash"]) for m in self.log.marks_after(message.after, 64))
        return Reply(chunk=FileChunk(message.file, message.offset, piece, len(data)), head=head, marks=marks)


@pytest.fixture
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProxyFiles:
    files = ProxyFiles(tmp_path / "proxy")
    monkeypatch.setattr(mirror_module.control, "call_blocking", files.call)
    return files


def _mirror(tmp_path: Path, active: bool = True) -> tuple[StateMirror, Egress]:
    settings = GatewaySettings(data_dir=tmp_path / "gw", egress_upstream_ca=None)
    channel = type("Channel", (), {"control_port": 8081})()
    state = tmp_path / "gw" / "egress" / SID
    state.mkdir(parents=True, exist_ok=True)
    egress = Egress(SID, "net", "10.213.0.0/28", "10.213.0.1", "c1", "corral-egress-x", "10.213.0.2", str(state))
    return StateMirror(settings, ProxyTokens(tmp_path / "gw"), channel, active), egress  # type: ignore[arg-type]


def _write(log: audit.AuditLog, n: int) -> None:
    for i in range(n):
        log.write("request", host=f"h{i}.test", url=f"https://h{i}.test/{'x' * i}")


def test_the_copy_is_the_proxys_log_byte_for_byte_and_its_chain_verifies(tmp_path: Path, proxy: ProxyFiles) -> None:
    log = proxy.open_log()
    _write(log, 12)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / AUDIT_FILE
    assert copy.read_bytes() == (proxy.root / AUDIT_FILE).read_bytes()
    assert audit.verify(copy).ok and audit.verify(copy).records == 12
    assert copy.stat().st_mode & 0o777 == 0o600
    _write(log, 5)
    mirror.follow_blocking(egress, final=True)
    assert copy.read_bytes() == (proxy.root / AUDIT_FILE).read_bytes() and audit.verify(copy).records == 17


def test_a_pass_from_the_tick_is_bounded_and_the_next_carries_on(
    tmp_path: Path, proxy: ProxyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_module, "CHUNKS_PER_PASS", 3)
    _write(proxy.open_log(), 20)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress)
    assert len(proxy.reads) == 3 + 1  # three of the audit, one of the (absent) responses
    copy = Path(egress.state_dir) / AUDIT_FILE
    assert mirror._copies[SID].audit.remote == 3 * proxy.chunk  # read so far, held until its head is read
    for _ in range(40):
        mirror.follow_blocking(egress)
    assert copy.read_bytes() == (proxy.root / AUDIT_FILE).read_bytes()


def _forge(proxy: ProxyFiles, host: str, chaining: bool) -> None:
    """A record of the proxy uid's own making appended to the proxy's log: one that follows the head
    as the writer would write it (``chaining``: seq, prev and its hash right), or garbage."""
    assert proxy.log is not None
    head = proxy.log.head
    if chaining:
        body = {"seq": head["seq"] + 1, "event": "request", "host": host, "prev": head["hash"], "session": SID}
        line = json.dumps({**body, "hash": audit._digest(body)}).encode()
    else:
        line = json.dumps({"seq": head["seq"] + 1, "host": host, "prev": head["hash"], "hash": "0" * 64}).encode()
    with (proxy.root / AUDIT_FILE).open("ab") as out:
        out.write(line + b"\n")


@pytest.mark.parametrize("chaining", [False, True])
def test_a_record_the_proxys_chain_does_not_hold_is_never_copied_and_the_copy_carries_on(
    tmp_path: Path, proxy: ProxyFiles, caplog: pytest.LogCaptureFixture, chaining: bool
) -> None:
    """A process of the proxy's uid writes a record of its own into the log (a well-made one too):
    the copy takes only the chain that leads to the head the proxy's memory vouches for."""
    log = proxy.open_log()
    _write(log, 3)
    _forge(proxy, "forged.test", chaining)
    _write(log, 2)  # the proxy's own records go on from its own head
    mirror, egress = _mirror(tmp_path)
    with caplog.at_level(logging.ERROR):
        mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / AUDIT_FILE
    assert audit.verify(copy).ok and audit.verify(copy).records == 5
    assert b"forged.test" not in copy.read_bytes()
    assert (mirror._copies[SID].audit.seq, mirror._copies[SID].audit.hash) == (5, log.head["hash"])
    assert f"egress audit of {SID}: 1 lines that are no records of its chain were left out" in caplog.messages
    _write(log, 1)
    mirror.follow_blocking(egress, final=True)
    assert audit.verify(copy).records == 6


def test_a_proxy_that_rewrote_what_was_copied_changes_nothing_in_the_copy(tmp_path: Path, proxy: ProxyFiles) -> None:
    _write(proxy.open_log(), 6)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / AUDIT_FILE
    kept = copy.read_bytes()
    (proxy.root / AUDIT_FILE).unlink()
    _write(proxy.open_log(), 2)  # a shorter history of its own making
    mirror.follow_blocking(egress, final=True)  # refused (offset past its end): said, not raised
    (proxy.root / AUDIT_FILE).unlink()
    _write(proxy.open_log(), 9)  # a longer one: its head does not follow the copy's
    mirror.follow_blocking(egress, final=True)
    assert copy.read_bytes() == kept and audit.verify(copy).records == 6
    assert mirror._copies[SID].audit.broken == "the proxy's head (seq 9) does not follow the copy's (seq 6)"


def test_a_line_longer_than_any_record_stops_the_copy_without_holding_it(tmp_path: Path, proxy: ProxyFiles) -> None:
    proxy.chunk = 256 << 10
    _write(proxy.open_log(), 1)
    with (proxy.root / AUDIT_FILE).open("ab") as out:
        out.write(b"x" * (audit.MAX_LINE_BYTES + 10))
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copies = mirror._copies[SID]
    assert copies.audit.broken is not None and "longer than any audit record" in copies.audit.broken
    assert copies.audit.partial == b"" and audit.verify(Path(egress.state_dir) / AUDIT_FILE).records == 1


def test_the_copy_stops_at_its_bound(tmp_path: Path, proxy: ProxyFiles) -> None:
    _write(proxy.open_log(), 30)
    mirror, egress = _mirror(tmp_path)
    mirror._audit_cap = 1000
    mirror.follow_blocking(egress, final=True)
    size = (Path(egress.state_dir) / AUDIT_FILE).stat().st_size
    assert 0 < size <= 1000 and mirror._copies[SID].audit.broken == "the proxy's audit log is past 1000 bytes"


def test_a_restarted_gateway_carries_on_from_its_copy(tmp_path: Path, proxy: ProxyFiles) -> None:
    log = proxy.open_log()
    _write(log, 4)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    _write(log, 3)
    again, _ = _mirror(tmp_path)  # a new process: nothing in memory, the copy on disk
    assert (again._of(egress).audit.seq, again._of(egress).audit.hash) == (4, mirror._copies[SID].audit.hash)
    again.follow_blocking(egress, final=True)
    assert (Path(egress.state_dir) / AUDIT_FILE).read_bytes() == (proxy.root / AUDIT_FILE).read_bytes()


def test_responses_are_appended_and_a_proxy_started_afresh_is_followed_after_the_copy(
    tmp_path: Path, proxy: ProxyFiles
) -> None:
    (proxy.root / RESPONSES_FILE).write_bytes(b"first flows " * 30)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / RESPONSES_FILE
    assert copy.read_bytes() == b"first flows " * 30
    (proxy.root / RESPONSES_FILE).write_bytes(b"after a restart")  # a new proxy's file of its own
    mirror.follow_blocking(egress, final=True)
    assert copy.read_bytes() == b"first flows " * 30 + b"after a restart"


def test_a_runtime_that_shares_the_directory_is_never_read(tmp_path: Path, proxy: ProxyFiles) -> None:
    _write(proxy.open_log(), 2)
    mirror, egress = _mirror(tmp_path, active=False)
    mirror.follow_blocking(egress, final=True)
    assert proxy.reads == [] and not (Path(egress.state_dir) / AUDIT_FILE).exists()


def test_a_copy_on_disk_that_is_no_chain_is_followed_no_further(tmp_path: Path) -> None:
    path = tmp_path / AUDIT_FILE
    path.write_bytes(b'{"seq": 1, "prev": "x", "hash": "y"}\n')
    copy = AuditCopy.of(path)
    assert copy.broken == "the gateway's copy is no chain at seq 1"


def test_lines_no_head_vouches_for_are_held_bounded(tmp_path: Path) -> None:
    copy = AuditCopy(tmp_path / AUDIT_FILE)
    other = audit.AuditLog(tmp_path / "other.jsonl", SID)
    _write(other, 3)
    lines = (tmp_path / "other.jsonl").read_bytes()
    assert copy.take(lines, None) == b"" and len(copy.held) == 3  # read, not vouched for yet: held
    assert copy.take(b"", Head(3, other.head["hash"])) == lines and copy.held == []
    mirror_module.MAX_HELD_BYTES, kept = 10, mirror_module.MAX_HELD_BYTES
    try:
        _write(other, 1)
        last = (tmp_path / "other.jsonl").read_bytes()[len(lines) :]
        assert copy.take(last, None) == b"" and copy.broken is not None and "vouch" in copy.broken
    finally:
        mirror_module.MAX_HELD_BYTES = kept


def test_a_backlog_past_what_may_be_held_is_caught_up_mark_by_mark(
    tmp_path: Path, proxy: ProxyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway back after a while (a restart, a partition) finds more than it may hold unvouched:
    the chain's marks, every MARK_EVERY records from the proxy's memory, vouch for it a stretch at a time."""
    proxy.chunk = 8192
    log = proxy.open_log()
    for i in range(3 * audit.MARK_EVERY + 5):
        log.write("request", host="even.test", url=f"https://even.test/{i:06d}")  # records of one size
    stretch = (proxy.root / AUDIT_FILE).stat().st_size // 3
    monkeypatch.setattr(mirror_module, "MAX_HELD_BYTES", stretch + 2 * proxy.chunk)  # less than the backlog
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = mirror._copies[SID].audit
    assert copy.broken is None and copy.seq == log.seq
    assert (Path(egress.state_dir) / AUDIT_FILE).read_bytes() == (proxy.root / AUDIT_FILE).read_bytes()
    assert any(read.after == audit.MARK_EVERY for read in proxy.reads)  # the copy said how far it was


def test_a_deeply_nested_line_from_the_proxys_uid_is_dropped_not_raised(tmp_path: Path, proxy: ProxyFiles) -> None:
    """A process of the proxy's uid appends a line json cannot parse without recursing past Python's
    limit: it is garbage like any other (dropped), never an exception out of the mirror (which would
    fail the egress round of every session each tick and leave the proxy behind at teardown)."""
    proxy.chunk = 256 << 10
    log = proxy.open_log()
    _write(log, 2)
    with (proxy.root / AUDIT_FILE).open("ab") as out:
        out.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    _write(log, 1)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    assert audit.verify(Path(egress.state_dir) / AUDIT_FILE).records == 3
    assert mirror._copies[SID].audit.dropped == 1


class EndlessProxy:
    """A compromised proxy that answers every read with a little garbage and a file size far past it:
    a copy that believed it would read forever."""

    def __init__(self) -> None:
        self.reads = 0

    def call(self, host: str, port: int, token: str, message: object, timeout_s: float = 5.0) -> Reply:
        from corral.contracts.control import FileChunk

        assert isinstance(message, ReadState)
        self.reads += 1
        if self.reads > 100_000:
            raise AssertionError("the mirror never stops reading")
        return Reply(chunk=FileChunk(message.file, message.offset, b"x\n", 1 << 49))


def test_a_final_pass_against_a_proxy_that_never_ends_its_file_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endless = EndlessProxy()
    monkeypatch.setattr(mirror_module.control, "call_blocking", endless.call)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)  # the teardown's: it must come back
    bound = mirror.final_chunks(mirror._audit_cap + mirror_module.MAX_HELD_BYTES)
    assert endless.reads <= bound + mirror.final_chunks(mirror._responses_cap)
    assert not (Path(egress.state_dir) / AUDIT_FILE).exists()


def test_a_pass_against_a_proxy_that_answers_slowly_ends_at_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read answered just inside its own timeout: the pass (the tick's egress round waits on
    it) still ends at its time, not after every read it may take."""
    endless = EndlessProxy()
    now = [0.0]

    def slow(*args: object, **kwargs: object) -> Reply:
        now[0] += 1.9  # just inside POLL_TIMEOUT_S
        return endless.call(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror_module.control, "call_blocking", slow)
    mirror, egress = _mirror(tmp_path)
    mirror._clock = lambda: now[0]
    mirror.follow_blocking(egress)
    assert now[0] <= mirror_module.PASS_S + 2
    mirror.follow_blocking(egress, final=True)
    assert now[0] <= mirror_module.PASS_S + mirror_module.FINAL_PASS_S + 4


def test_a_proxy_restarted_from_the_copy_is_followed_on_from_the_copy(tmp_path: Path, proxy: ProxyFiles) -> None:
    """The watchdog restarts a dead proxy seeded from the gateway's copy (runtime.swarm's
    restart_proxy): its file is the copy, shorter than where the old proxy's reads had got to when
    the old one's last lines were read and not yet vouched (or dropped as forged). The mirror takes
    the new proxy's records from the copy's end, not from the old offset (refused: past the end, or
    mid-record), or the audit of the rest of the session would never reach the gateway."""
    log = proxy.open_log()
    _write(log, 4)
    _forge(proxy, "unvouched.test", chaining=True)  # read, held, never vouched: the offset runs ahead
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / AUDIT_FILE
    assert audit.verify(copy).records == 4
    (proxy.root / AUDIT_FILE).write_bytes(copy.read_bytes())  # the new task, planted from the seed
    log = proxy.open_log()
    _write(log, 3)
    mirror.restarted(SID)  # what EgressManager does once the runtime restarted the proxy
    mirror.follow_blocking(egress, final=True)
    assert audit.verify(copy).ok and audit.verify(copy).records == 7
    assert copy.read_bytes() == (proxy.root / AUDIT_FILE).read_bytes()


async def test_the_watchdogs_restart_has_the_mirror_follow_on_from_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.gateway.egress.manager import EgressManager

    manager = EgressManager(GatewaySettings(data_dir=tmp_path / "data"), runtime=None)  # type: ignore[arg-type]
    _, egress = _mirror(tmp_path)
    manager.mirror.active = True
    manager.mirror._of(egress).audit.remote = 12_345  # where the dead proxy's reads had got to
    monkeypatch.setattr(manager.provision, "restart_blocking", lambda e: e)
    revived, gone = await manager.revive([egress], {SID: "exited"})
    assert revived == {SID: egress} and gone == []
    assert manager.mirror._of(egress).audit.remote == 0  # the copy on disk (none yet), not the old offset


def test_a_record_respelled_by_the_proxys_uid_is_not_what_the_copy_takes(tmp_path: Path, proxy: ProxyFiles) -> None:
    """A process of the proxy's uid appends the proxy's own last record spelled another way: the
    same fields once parsed (a key given twice, the last one the real value), so the same hash, but
    other bytes, which a reader that keeps the first of two keys, or greps the file, reads as the
    forger wrote them. The copy holds the writer's bytes only."""
    proxy.chunk = 256 << 10  # both spellings in one read, as a real read of 256 KiB takes them
    log = proxy.open_log()
    _write(log, 2)
    real = (proxy.root / AUDIT_FILE).read_bytes().splitlines(keepends=True)[-1]
    respelled = real.replace(b'"host":', b'"host":"forged.test","host":', 1)
    assert audit.link_of(real) is not None
    with (proxy.root / AUDIT_FILE).open("ab") as out:
        out.write(respelled)
    mirror, egress = _mirror(tmp_path)
    mirror.follow_blocking(egress, final=True)
    copy = Path(egress.state_dir) / AUDIT_FILE
    assert b"forged.test" not in copy.read_bytes()
    assert audit.verify(copy).records == 2


async def test_reads_waiting_on_a_slow_pass_hold_no_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads of the audit (each waits for a pass first) while a proxy answers slowly, or a node is
    cut off: the waiting is the event loop's, not a worker thread each (the default pool has a few:
    a few reads polling one session would stall every runtime call of the gateway)."""
    import asyncio
    import threading

    release = threading.Event()
    inside = threading.Semaphore(0)
    threads: list[int] = []
    most = [0]

    def slow(*args: object, **kwargs: object) -> Reply:
        inside.release()
        release.wait(timeout=30)
        raise ControlError("no answer")

    monkeypatch.setattr(mirror_module.control, "call_blocking", slow)
    mirror, egress = _mirror(tmp_path)
    real = mirror.follow_blocking

    def counted(*args: object, **kwargs: object) -> None:
        threads.append(1)
        most[0] = max(most[0], len(threads))
        try:
            real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            threads.pop()

    monkeypatch.setattr(mirror, "follow_blocking", counted)
    reads = [asyncio.create_task(mirror.follow(egress, wait=True)) for _ in range(5)]
    try:
        await asyncio.to_thread(inside.acquire, True, 30)  # the first pass is in its read
        for _ in range(20):
            await asyncio.sleep(0)  # every other read has had its turn to start waiting
        await asyncio.to_thread(lambda: None)  # and any thread it handed to has started
        assert most[0] == 1
    finally:
        release.set()
        await asyncio.gather(*reads)
    assert most[0] == 1  # each waiting read then had its own pass, one at a time
