"""Teams and virtual keys in the SQLite file, beside the conversations."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from gateway.conversations.sqlite import SQLiteStore
from gateway.metering.keys import KeyRecord, Team

_KEY_COLUMNS = (
    "id, hash, prefix, team_id, created_at, name, user, models, expires_at, revoked_at, metadata,"
    " limits"
)
# Fields an admin may change on a key.
KEY_UPDATABLE = ("name", "user", "models", "expires_at", "metadata", "limits")


def _key(row: tuple[Any, ...]) -> KeyRecord:
    id_, hash_, prefix, team, created, name, user, models, expires, revoked, metadata, limits = row
    return KeyRecord(
        id=id_,
        hash=hash_,
        prefix=prefix,
        team_id=team,
        created_at=created,
        name=name,
        user=user,
        models=tuple(orjson.loads(models)) if models is not None else None,
        expires_at=expires,
        revoked_at=revoked,
        metadata=orjson.loads(metadata),
        limits=orjson.loads(limits) if limits else None,
    )


def _encode(field: str, value: Any) -> Any:
    if field == "models":
        return None if value is None else orjson.dumps(list(value)).decode()
    if field == "metadata":
        return orjson.dumps(value or {}).decode()
    if field == "limits":
        return orjson.dumps(value).decode() if value else None
    return value


class KeyStore:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def create_team(self, team: Team) -> bool:
        """False when a team with that id exists."""

        def op(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "INSERT OR IGNORE INTO teams (id, name, created_at, metadata, limits)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    team.id,
                    team.name,
                    team.created_at,
                    orjson.dumps(team.metadata).decode(),
                    _encode("limits", team.limits),
                ),
            )
            return cursor.rowcount == 1

        return await self._store.call(op)

    async def teams(self) -> list[Team]:
        def op(db: sqlite3.Connection) -> list[Team]:
            rows = db.execute(
                "SELECT id, name, created_at, metadata, limits FROM teams ORDER BY created_at"
            )
            return [
                Team(i, n, c, orjson.loads(m), orjson.loads(lim) if lim else None)
                for i, n, c, m, lim in rows
            ]

        return await self._store.call(op)

    async def team(self, team_id: str) -> Team | None:
        return next((t for t in await self.teams() if t.id == team_id), None)

    async def create_key(self, key: KeyRecord) -> None:
        values = (
            key.id,
            key.hash,
            key.prefix,
            key.team_id,
            key.created_at,
            key.name,
            key.user,
            _encode("models", key.models),
            key.expires_at,
            key.revoked_at,
            _encode("metadata", key.metadata),
            _encode("limits", key.limits),
        )
        await self._store.call(
            lambda db: db.execute(
                f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        )

    async def keys(self, team_id: str | None = None) -> list[KeyRecord]:
        def op(db: sqlite3.Connection) -> list[KeyRecord]:
            if team_id is None:
                rows = db.execute(f"SELECT {_KEY_COLUMNS} FROM keys ORDER BY created_at")
            else:
                rows = db.execute(
                    f"SELECT {_KEY_COLUMNS} FROM keys WHERE team_id = ? ORDER BY created_at",
                    (team_id,),
                )
            return [_key(r) for r in rows]

        return await self._store.call(op)

    async def key(self, key_id: str) -> KeyRecord | None:
        def op(db: sqlite3.Connection) -> KeyRecord | None:
            row = db.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?", (key_id,)).fetchone()
            return _key(row) if row else None

        return await self._store.call(op)

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        def op(db: sqlite3.Connection) -> KeyRecord | None:
            row = db.execute(
                f"SELECT {_KEY_COLUMNS} FROM keys WHERE hash = ?", (key_hash,)
            ).fetchone()
            return _key(row) if row else None

        return await self._store.call(op)

    async def update_key(self, key_id: str, changes: dict[str, Any]) -> KeyRecord | None:
        fields = [f for f in changes if f in KEY_UPDATABLE or f == "revoked_at"]

        def op(db: sqlite3.Connection) -> KeyRecord | None:
            if fields:
                assignments = ", ".join(f"{f} = ?" for f in fields)
                values = [_encode(f, changes[f]) for f in fields]
                db.execute(f"UPDATE keys SET {assignments} WHERE id = ?", (*values, key_id))
            row = db.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?", (key_id,)).fetchone()
            return _key(row) if row else None

        return await self._store.call(op)

    async def update_team_limits(self, team_id: str, limits: dict[str, Any] | None) -> Team | None:
        await self._store.call(
            lambda db: db.execute(
                "UPDATE teams SET limits = ? WHERE id = ?", (_encode("limits", limits), team_id)
            )
        )
        return await self.team(team_id)
