"""The control channel: the gateway sets the policy and the brokered secrets, reads the status and
reports viewer links; the controller reports actions (with their actor when not the agent's) and
changes of the control lease (the wire format and its parsing: :mod:`corral.proxy.control`).

A TCP server of its own on the session address, started when mitmproxy runs. Each connection
authenticates with its first line; the actions a controller connection started end with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import os
from pathlib import Path

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from corral.contracts.control import MAX_MARKS, FileChunk, Head, Refusal, ReplayState, Reply, SecretsState
from corral.errors import InvalidMessage
from corral.proxy import control
from corral.proxy.addons.state import Shared
from corral.proxy.control import AUDIT_FILE, POLICY_FILE, RESPONSES_FILE
from corral.proxy.secrets import SECRETS_FILE


class ControlChannel:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.server: asyncio.Server | None = None
        self._tokens: dict[str, str] = {}  # from corral_tokens_file, beside the options of the same name

    def load(self, loader: Loader) -> None:
        loader.add_option("corral_control_host", str, "", "Address the control channel listens on; empty: none.")
        loader.add_option("corral_control_port", int, control.CONTROL_PORT, "Port of the control channel.")
        loader.add_option("corral_gateway_token", str, "", "Token of the gateway on the control channel.")
        loader.add_option("corral_controller_token", str, "", "Token of the sandbox's controller.")
        loader.add_option(
            "corral_tokens_file", str, "", 'JSON {"gateway": ..., "controller": ...}: the tokens, off the command line.'
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "corral_tokens_file" in updated and opts.corral_tokens_file:
            # A file in the proxy's own tmpfs: a command line is readable by every user of the host.
            try:
                tokens = json.loads(Path(opts.corral_tokens_file).read_text())
                self._tokens = {
                    "gateway": str(tokens.get("gateway", "")),
                    "controller": str(tokens.get("controller", "")),
                }
            except (OSError, ValueError, AttributeError) as exc:
                message = f"corral_tokens_file: cannot read the tokens in {opts.corral_tokens_file}: {exc}"
                raise exceptions.OptionsError(message) from None  # type: ignore[no-untyped-call,unused-ignore]

    async def running(self) -> None:
        opts = ctx.options
        if opts.corral_control_host and self.server is None:
            self.server = await asyncio.start_server(
                self._serve, opts.corral_control_host, opts.corral_control_port, limit=control.MAX_LINE_BYTES
            )

    def done(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def role(self, token: str) -> control.Role | None:
        """Who a hello's token names: the gateway, the controller, or nobody."""
        gateway = self._gateway_token()
        controller = self._tokens.get("controller") or ctx.options.corral_controller_token
        if gateway and hmac.compare_digest(token, gateway):
            return "gateway"
        if controller and hmac.compare_digest(token, controller):
            return "controller"
        return None

    def _gateway_token(self) -> str:
        return self._tokens.get("gateway") or str(ctx.options.corral_gateway_token)

    def handle(self, role: control.Role, message: control.Message) -> Reply | None:
        """One control message from an authenticated peer; the reply, or None when none is due.
        Raises ValueError for a message this role may not send."""
        if isinstance(message, control.ActionEvent):
            if role != "controller":
                raise ValueError("only the controller reports actions")
            if message.phase == "start":
                self.shared.actions.start(message.id, message.actor)
            else:
                self.shared.actions.end(message.id)
            return Reply() if message.ack else None
        if isinstance(message, control.LeaseEvent):
            if role != "controller":
                raise ValueError("only the controller reports the control lease")
            self.shared.lease_holder = message.holder
            self.shared.journal.write(
                "control", change=message.change, holder=message.holder, previous=message.previous
            )
            return None  # reported without an ack: the lease never waits on the audit
        if isinstance(message, control.DownloadEvent):
            return self._download(role, message)
        if role != "gateway":
            raise ValueError("only the gateway may do that")
        if isinstance(message, control.LinkEvent):
            return self._link(message)
        if isinstance(message, control.LifetimeEvent):
            return self._lifetime(message)
        if isinstance(message, control.VolumeEvent):
            return self._volume(message)
        if isinstance(message, control.ProfileEvent):
            return self._profile(message)
        if isinstance(message, control.SessionEvent):
            return self._session(message)
        if isinstance(message, control.PreviewEvent):
            return self._preview(message)
        if isinstance(message, control.SetPolicy):
            return self._set_policy(message)
        if isinstance(message, control.Status):
            return self._status()
        if isinstance(message, control.SetSecrets):
            return self._set_secrets(message)
        if isinstance(message, control.ReadState):
            return self._read_state(message)
        raise ValueError("unexpected message")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened: set[str] = set()  # actions this connection started: dropped with it (a dead controller)
        try:
            role = await self._hello(reader, writer)
            while role is not None and (line := await reader.readline()):
                reply = self._answer(role, line, opened)
                if reply is not None:
                    writer.write(control.encode(reply))
                    await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            for action in opened:
                self.shared.actions.end(action)
            writer.close()

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> control.Role | None:
        """The connection's role from its first well-formed line, answered; None (refused) for anyone else."""
        while line := await reader.readline():
            try:
                message = control.parse_message(line)
            except InvalidMessage as exc:
                writer.write(control.encode(control.refusal(exc)))
                await writer.drain()
                continue
            role = self.role(message.token) if isinstance(message, control.Hello) else None
            writer.write(control.encode(Reply(role=role) if role else Refusal("unknown token")))
            await writer.drain()
            return role
        return None

    def _answer(self, role: control.Role, line: bytes, opened: set[str]) -> Reply | Refusal | None:
        try:
            message = control.parse_message(line)
            if isinstance(message, control.ActionEvent):
                (opened.add if message.phase == "start" else opened.discard)(message.id)
            return self.handle(role, message)
        except InvalidMessage as exc:
            return control.refusal(exc)
        except (ValueError, OSError) as exc:
            return Refusal(str(exc), control.INVALID_REQUEST)

    def _link(self, message: control.LinkEvent) -> Reply:
        """A viewer link made, used, revoked or expired, as the gateway reports it: its audit record."""
        self.shared.journal.write(
            "link",
            link=message.link,
            mode=message.mode,
            change=message.change,
            actor=message.actor,
            expires_at=message.expires_at,
        )
        return Reply(head=self._head())

    def _lifetime(self, message: control.LifetimeEvent) -> Reply:
        """A session's expiry changed by its owner, as the gateway reports it: its audit record."""
        self.shared.journal.write(
            "lifetime",
            actor=message.actor,
            expires_at=message.expires_at,
            previous_expires_at=message.previous_expires_at,
        )
        return Reply(head=self._head())

    def _volume(self, message: control.VolumeEvent) -> Reply:
        """The session's workspace volume claimed or released, as the gateway reports it: its audit record."""
        self.shared.journal.write(
            "volume",
            volume=message.volume,
            change=message.change,
            size_mb=message.size_mb,
            used_bytes=message.used_bytes,
        )
        return Reply(head=self._head())

    def _profile(self, message: control.ProfileEvent) -> Reply:
        """A browser profile loaded or saved, as the gateway reports it: its audit record (name and size)."""
        self.shared.journal.write(
            "profile", profile=message.profile, change=message.change, bytes=message.size, actor=message.actor
        )
        return Reply(head=self._head())

    def _session(self, message: control.SessionEvent) -> Reply:
        """The session paused or resumed, as the gateway reports it: its audit record (sizes only)."""
        self.shared.journal.write(
            "session", change=message.change, actor=message.actor, saved=dict(message.saved), tabs=message.tabs
        )
        return Reply(head=self._head())

    def _preview(self, message: control.PreviewEvent) -> Reply:
        """A port preview made, revoked or expired, or a connection through it opened or closed, as the
        gateway reports it: its audit record (the client's address, bytes each way; never a secret)."""
        self.shared.journal.write(
            "preview",
            preview=message.preview,
            port=message.port,
            change=message.change,
            actor=message.actor,
            expires_at=message.expires_at,
            remote=message.remote,
            bytes_in=message.bytes_in,
            bytes_out=message.bytes_out,
        )
        return Reply(head=self._head())

    def _download(self, role: control.Role, message: control.DownloadEvent) -> Reply | None:
        """A download begun or ended in the sandbox's browser (the controller's report, no ack: a
        download never waits on the audit), or fetched through the gateway (the gateway's, answered
        with the chain's head): its audit record."""
        if (message.change == "fetched") != (role == "gateway"):
            raise ValueError("the gateway reports fetches, the controller the rest of a download's life")
        self.shared.journal.write(
            "download",
            download=message.download,
            name=message.name,
            url=message.url,
            change=message.change,
            bytes=message.size,
            actor=message.actor,
            action=message.action,
        )
        return Reply(head=self._head()) if role == "gateway" else None

    def _set_policy(self, message: control.SetPolicy) -> Reply:
        live = self.shared.policy
        policy = live.policy.with_allow(message.allow)
        generation = live.generation + 1
        # Persisted and logged before it takes effect: no policy is ever live without its record.
        if ctx.options.corral_state_dir:
            live.persist(Path(ctx.options.corral_state_dir) / POLICY_FILE, policy.allow, message.mode, generation)
        self.shared.journal.write(
            "policy",
            allow=policy.allow,
            mode=message.mode,
            previous_allow=live.policy.allow,
            previous_mode=live.mode,
            actor=message.actor,
            generation=generation,
        )
        live.policy, live.mode, live.generation = policy, message.mode, generation
        return self._policy_state()

    def _set_secrets(self, message: control.SetSecrets) -> Reply:
        book = self.shared.secrets
        change = book.plan(message.secrets)  # refused whole (InvalidMessage) before anything changes
        # Persisted and logged before it takes effect, as a policy is; neither holds a value.
        if ctx.options.corral_state_dir:
            book.persist(Path(ctx.options.corral_state_dir) / SECRETS_FILE, change)
        self.shared.journal.write(
            "secrets",
            actor=message.actor,
            generation=change.generation,
            added=change.added,
            rotated=change.rotated,
            revoked=change.revoked,
            restored=change.restored,
            bindings=change.bindings(),
        )
        book.apply(change)
        return Reply(secrets=self._secrets_state(), head=self._head())

    def _read_state(self, message: control.ReadState) -> Reply:
        if not ctx.options.corral_state_dir:
            raise ValueError("this proxy keeps no state files")
        if message.file == "responses" and self.shared.responses is not None:
            self.shared.responses.flush()  # the last second's answers too
        # The audit's head from memory, taken before the read (so a read to the end holds it): the
        # gateway copies only the chain that leads to it, whatever else the file holds.
        if message.file != "audit":
            return read_state(Path(ctx.options.corral_state_dir), message)
        head = self._head()
        marks = tuple(
            Head(int(m["seq"]), str(m["hash"])) for m in self.shared.journal.marks_after(message.after, MAX_MARKS)
        )
        return dataclasses.replace(read_state(Path(ctx.options.corral_state_dir), message), head=head, marks=marks)

    def _status(self) -> Reply:
        shared = self.shared
        hermetic = shared.policy.hermetic
        return dataclasses.replace(
            self._policy_state(),
            session=str(ctx.options.corral_session),
            records=shared.journal.records,
            actions=tuple(shared.actions.ids()),
            hermetic=hermetic,
            replay=ReplayState(shared.replay.flows, shared.replay.error) if hermetic else None,
            responses=shared.responses.counts() if shared.responses is not None else None,
            secrets=self._secrets_state(),
        )

    def _policy_state(self) -> Reply:
        """What the gateway checks on each answer: the live policy, its generation, the chain's head."""
        live = self.shared.policy
        return Reply(allow=tuple(live.policy.allow), mode=live.mode, generation=live.generation, head=self._head())

    def _head(self) -> Head:
        head = self.shared.journal.head
        return Head(int(head["seq"]), str(head["hash"]))

    def _secrets_state(self) -> SecretsState | None:
        return SecretsState.parse(self.shared.secrets.state(self._gateway_token()))


def read_state(state_dir: Path, message: control.ReadState) -> Reply:
    """Up to ``limit`` bytes of the audit log or the recorded responses from ``offset``: what the
    gateway mirrors into its own state directory where it shares none with the proxy. A file not
    made yet reads as empty; an offset past its end is refused (the gateway's copy is not this
    file's)."""
    name = AUDIT_FILE if message.file == "audit" else RESPONSES_FILE
    try:
        with (state_dir / name).open("rb") as source:
            size = os.fstat(source.fileno()).st_size
            if message.offset > size:
                problem = f"offset {message.offset} is past the end of {name} ({size} bytes)"
                raise InvalidMessage(control.INVALID_FIELD, problem, "offset")
            source.seek(message.offset)
            data = source.read(min(message.limit, size - message.offset))
    except FileNotFoundError:
        if message.offset:
            raise InvalidMessage(
                control.INVALID_FIELD, f"offset {message.offset}: there is no {name}", "offset"
            ) from None
        data, size = b"", 0
    return Reply(chunk=FileChunk(message.file, message.offset, data, size))
