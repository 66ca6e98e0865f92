"""``/v1/sessions``: make, list, show, change (egress, secrets, lifetime) and end sessions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response
from starlette.requests import HTTPConnection

from corral.errors import InvalidRequest, SandboxError, SandboxStartFailed
from corral.gateway.auth import OWNER_ACTOR
from corral.gateway.models import (
    CreatedSession,
    CreateSession,
    ResumeSession,
    SessionOut,
    SessionTerms,
    UpdateSecrets,
    UpdateSession,
    env_secret_problem,
)
from corral.gateway.routes.deps import (
    CallerDep,
    JsonBody,
    KeyIdDep,
    LiveSessionDep,
    ManagerDep,
    RunningSessionDep,
    body_of,
)
from corral.gateway.secrets import SecretSet
from corral.gateway.sessions.records import Session

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def session_out(conn: HTTPConnection, session: Session) -> SessionOut:
    """The session as the API shows it: its terms, its live state and where to reach it."""
    base = str(conn.base_url).rstrip("/")
    ws_base = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    return SessionOut(
        **session.record.model_dump(include=set(SessionTerms.model_fields)),
        state=session.state,
        last_activity_at=session.last_activity_at,
        container=session.sandbox.name,
        node=session.sandbox.node,
        ws_url=f"{ws_base}/v1/sessions/{session.id}/ws",
        actions_url=f"{base}/v1/sessions/{session.id}/actions",
        traffic_url=f"{base}/v1/sessions/{session.id}/traffic",
        secrets=placeholders(session),
    )


def placeholders(session: Session) -> dict[str, str]:
    """Name -> placeholder of each of the session's secrets: what the sandbox holds (never a value)."""
    return SecretSet(session.record.secrets).placeholders()


@router.post("", status_code=201, response_model=CreatedSession)
async def create_session(
    request: Request,
    key_id: KeyIdDep,
    manager: ManagerDep,
    reading: Annotated[JsonBody[CreateSession], body_of(CreateSession)],
) -> CreatedSession:
    body = await reading.read()
    try:
        session, token = await manager.create(key_id, body)
    except SandboxError as exc:  # whatever the host side said, for the caller the start failed (the log says why)
        raise SandboxStartFailed(str(exc)) from exc
    return CreatedSession(**session_out(request, session).model_dump(), token=token)


@router.get("", response_model=list[SessionOut])
async def list_sessions(request: Request, key_id: KeyIdDep, manager: ManagerDep) -> list[SessionOut]:
    return [session_out(request, s) for s in manager.list(key_id)]


@router.get("/{session_id}", response_model=SessionOut)
async def get_session(request: Request, session: LiveSessionDep) -> SessionOut:
    return session_out(request, session)


@router.delete("/{session_id}", status_code=204)
async def delete_session(session: LiveSessionDep, manager: ManagerDep) -> Response:
    await manager.delete(session.id)
    return Response(status_code=204)


@router.patch("/{session_id}", response_model=SessionOut)
async def update_session(
    request: Request,
    session: RunningSessionDep,  # a paused session's proxy is stopped: its changes wait for the resume (409)
    who: CallerDep,
    manager: ManagerDep,
    reading: Annotated[JsonBody[UpdateSession], body_of(UpdateSession)],
) -> SessionOut:
    who.change_session()  # a key, whatever the body: the agent's token changes nothing (no body read)
    body = await reading.read()
    if body.timeout_s is not None:
        manager.check_timeout(body.timeout_s)  # over the maximum: refused before anything changes
    if body.changes_egress:
        who.change_egress()
        refuse_secret_in_env(session, body.secrets)
        await manager.update_egress(session, body.allow, body.egress_mode, OWNER_ACTOR, body.secrets)
    if body.timeout_s is not None:
        await manager.set_timeout(session, body.timeout_s, OWNER_ACTOR)
    return session_out(request, session)


def refuse_secret_in_env(session: Session, changes: UpdateSecrets | None) -> None:
    """A new secret or value must not be one the agent reads already in the session's env (nor take an
    env variable's name): secrets stay brokered. InvalidRequest, nothing changed."""
    values = {name: u.value.get_secret_value() for name, u in (changes or {}).items() if u and u.value}
    problem = env_secret_problem(session.record.env_values, values)
    if problem is not None:
        raise InvalidRequest(problem[1], field=f"env.{problem[0]}")


@router.post("/{session_id}/pause", response_model=SessionOut)
async def pause_session(request: Request, session: LiveSessionDep, who: CallerDep, manager: ManagerDep) -> SessionOut:
    """Save its state, remove its sandbox, stop its proxy: its slot is free until it resumes. The
    owner's key only: the agent's token must not end a person's turn on its screen (a pause closes
    every live view) nor stop or restart its own session against the owner (its idle timeout
    pauses it with ``idle_action: "pause"``)."""
    who.change_session()
    await manager.pause(session)
    return session_out(request, session)


@router.post("/{session_id}/resume", response_model=SessionOut)
async def resume_session(
    request: Request,
    session: LiveSessionDep,
    who: CallerDep,
    manager: ManagerDep,
    reading: Annotated[JsonBody[ResumeSession], body_of(ResumeSession)],
) -> SessionOut:
    """A new sandbox for the same id and token, its state put back (the body: secret values a
    restarted gateway no longer holds)."""
    who.change_session()  # the owner's key only, as a pause (and the secret values are the owner's to give)
    body = await reading.read()
    try:
        await manager.resume(session, body)
    except SandboxError as exc:
        raise SandboxStartFailed(str(exc)) from exc
    return session_out(request, session)


@router.get("/{session_id}/secrets", response_model=dict[str, str])
async def session_secrets(session: LiveSessionDep) -> dict[str, str]:
    """The session's secrets as the sandbox knows them: name -> placeholder (the owner's key or the
    session's token; the values are never given back)."""
    return placeholders(session)
