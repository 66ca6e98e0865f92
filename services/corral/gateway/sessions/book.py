"""The live sessions, by id, and their records in the store: the one place both are kept."""

from __future__ import annotations

from collections.abc import Mapping

from corral.errors import SessionNotFound
from corral.gateway.links import LinkRecord
from corral.gateway.previews.book import PreviewRecord
from corral.gateway.sessions.records import Session, SessionRecord
from corral.gateway.store import SessionStore


class SessionBook:
    """Who lives (adopted at start or made by a claim) until its end removes it; each change of a
    record written whole to the store."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def ids(self) -> set[str]:
        return set(self._sessions)

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id}")
        return session

    def find(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def sessions(self, owner: str | None = None) -> list[Session]:
        return [s for s in self._sessions.values() if owner is None or s.owner == owner]

    def running(self, owner: str | None = None) -> list[Session]:
        """The sessions that hold a slot: all but the paused ones (resuming ones hold theirs)."""
        return [s for s in self.sessions(owner) if s.state not in ("pausing", "paused")]

    def ready(self) -> list[Session]:
        """The sessions not being ended."""
        return [s for s in self._sessions.values() if s.state == "ready"]

    def add(self, session: Session) -> None:
        self._sessions[session.id] = session

    def save(self, session: Session) -> None:
        self.store.save(session.id, session.record.to_json())

    def remove(self, session_id: str) -> None:
        """Its end is done: out of the book and out of the store."""
        self._sessions.pop(session_id, None)
        self.store.delete(session_id)

    def stored_records(self) -> list[SessionRecord]:
        return self.store.load_all(SessionRecord.model_validate)

    def still_live(self, session: Session) -> None:
        """Raises SessionNotFound once the session is being ended: a change must not outlive it."""
        if session.state != "ready" or self._sessions.get(session.id) is not session:
            raise SessionNotFound(f"no session {session.id}")

    # -- viewer links (corral.gateway.links keeps them in the record) ---------------------------------

    def links_of(self, session_id: str) -> dict[str, LinkRecord]:
        return self.get(session_id).record.links

    def save_links(self, session_id: str, links: Mapping[str, LinkRecord]) -> None:
        session = self.get(session_id)
        session.record = session.record.model_copy(update={"links": dict(links)})
        if session.state == "ready":  # a session being ended keeps no record to write
            self.save(session)

    # -- port previews (corral.gateway.previews keeps them in the record) ------------------------------

    def previews_of(self, session_id: str) -> dict[str, PreviewRecord]:
        return self.get(session_id).record.previews

    def save_previews(self, session_id: str, previews: Mapping[str, PreviewRecord]) -> None:
        session = self.get(session_id)
        session.record = session.record.model_copy(update={"previews": dict(previews)})
        if session.state == "ready":  # a session being ended keeps no record to write
            self.save(session)
