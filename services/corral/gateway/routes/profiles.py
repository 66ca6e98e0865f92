"""Saved browser profiles (corral.gateway.profiles): ``/v1/profiles`` for an API key's own, and
``POST /v1/sessions/{id}/profile/save`` to save a live session's browser now. Another key's profile
is no profile (404), never a 403 that would say it exists."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from corral.errors import Forbidden, ProfilesOff
from corral.gateway import auth
from corral.gateway.models import DeletedProfile, ProfileOut
from corral.gateway.profiles import ProfileInfo, check_name
from corral.gateway.routes.deps import CallerDep, KeyIdDep, ManagerDep, RunningSessionDep
from corral.gateway.sessions import SessionManager
from corral.gateway.sessions.browserprofiles import BrowserProfiles

router = APIRouter(tags=["profiles"])


def _profiles(manager: SessionManager) -> BrowserProfiles:
    if manager.profiles is None:
        raise ProfilesOff("browser profiles are not wired on this gateway")
    return manager.profiles


def _out(info: ProfileInfo) -> ProfileOut:
    return ProfileOut(name=info.name, size=info.size, saved_at=info.saved_at)


@router.get("/v1/profiles", response_model=list[ProfileOut])
async def list_profiles(key_id: KeyIdDep, manager: ManagerDep) -> list[ProfileOut]:
    """This API key's saved profiles: name, size and when saved (never contents)."""
    store = _profiles(manager).store
    return [_out(info) for info in await asyncio.to_thread(store.list, key_id)]


@router.get("/v1/profiles/{name}", response_model=ProfileOut)
async def get_profile(name: str, key_id: KeyIdDep, manager: ManagerDep) -> ProfileOut:
    store = _profiles(manager).store
    return _out(await asyncio.to_thread(store.info, key_id, check_name(name)))


@router.delete("/v1/profiles/{name}", response_model=DeletedProfile)
async def delete_profile(name: str, key_id: KeyIdDep, manager: ManagerDep) -> DeletedProfile:
    """Deleted for good (a live session that loaded it keeps its browser, and saves it again if asked to)."""
    await asyncio.to_thread(_profiles(manager).store.delete, key_id, check_name(name))
    return DeletedProfile(name=name)


@router.post("/v1/sessions/{session_id}/profile/save", response_model=ProfileOut)
async def save_profile(session: RunningSessionDep, who: CallerDep, manager: ManagerDep) -> ProfileOut:
    """The session's browser state saved now under the profile it was created with (Chromium is
    stopped for the copy and started again: open pages reload onto about:blank). The owner's key
    only: a save restarts the browser, so the agent's token could close the pages of a person who
    holds its screen (a profile made with ``save: true`` is still saved at the session's end)."""
    if who.key_id is None:
        raise Forbidden(
            "a session's profile is saved now only with its owner's API key (saving restarts the browser);"
            " one created with save true is saved at the session's end"
        )
    async with session.changing:
        info = await _profiles(manager).save(session, auth.OWNER_ACTOR)
    return _out(info)
