"""Teams and virtual keys in the store, beside the conversations."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.metering.keys import KeyRecord, Team
from gateway.storage.db import Db, Row
from gateway.storage.store import Store

_KEY_COLUMNS = (
    'id, hash, prefix, team_id, created_at, name, "user", models, expires_at, revoked_at, metadata,'
    " limits"
)
# Fields an admin may change on a key.
KEY_UPDATABLE = ("name", "user", "models", "expires_at", "metadata", "limits")


def _key(row: Row) -> KeyRecord:
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
    def __init__(self, store: Store) -> None:
        self._store = store

    async def create_team(self, team: Team) -> bool:
        """False when a team with that id exists."""

        async def op(db: Db) -> bool:
            inserted = await db.execute(
                "INSERT INTO teams (id, name, created_at, metadata, limits)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                team.id,
                team.name,
                team.created_at,
                orjson.dumps(team.metadata).decode(),
                _encode("limits", team.limits),
            )
            return inserted == 1

        return await self._store.run(op)

    async def teams(self) -> list[Team]:
        async def op(db: Db) -> list[Team]:
            rows = await db.fetch(
                "SELECT id, name, created_at, metadata, limits FROM teams ORDER BY created_at"
            )
            return [
                Team(i, n, c, orjson.loads(m), orjson.loads(lim) if lim else None)
                for i, n, c, m, lim in rows
            ]

        return await self._store.lookup(op)

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

        async def op(db: Db) -> None:
            await db.execute(
                f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                *values,
            )

        await self._store.run(op)

    async def keys(self, team_id: str | None = None) -> list[KeyRecord]:
        async def op(db: Db) -> list[KeyRecord]:
            if team_id is None:
                rows = await db.fetch(f"SELECT {_KEY_COLUMNS} FROM keys ORDER BY created_at")
            else:
                rows = await db.fetch(
                    f"SELECT {_KEY_COLUMNS} FROM keys WHERE team_id = ? ORDER BY created_at",
                    team_id,
                )
            return [_key(r) for r in rows]

        return await self._store.run(op)

    async def key(self, key_id: str) -> KeyRecord | None:
        return await self._one("id", key_id)

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        return await self._one("hash", key_hash)

    async def _one(self, column: str, value: str) -> KeyRecord | None:
        async def op(db: Db) -> KeyRecord | None:
            row = await db.fetchrow(f"SELECT {_KEY_COLUMNS} FROM keys WHERE {column} = ?", value)
            return _key(row) if row else None

        # A request's key check: never behind the turns queued for the database.
        return await self._store.lookup(op)

    async def update_key(self, key_id: str, changes: dict[str, Any]) -> KeyRecord | None:
        fields = [f for f in changes if f in KEY_UPDATABLE or f == "revoked_at"]

        async def op(db: Db) -> KeyRecord | None:
            if fields:
                assignments = ", ".join(f'"{f}" = ?' for f in fields)
                values = [_encode(f, changes[f]) for f in fields]
                await db.execute(f"UPDATE keys SET {assignments} WHERE id = ?", *values, key_id)
            row = await db.fetchrow(f"SELECT {_KEY_COLUMNS} FROM keys WHERE id = ?", key_id)
            return _key(row) if row else None

        return await self._store.transact(op)

    async def rename_team(self, team_id: str, name: str) -> None:
        async def op(db: Db) -> None:
            await db.execute("UPDATE teams SET name = ? WHERE id = ?", name, team_id)

        await self._store.run(op)

    async def delete_team(self, team_id: str) -> bool:
        """Remove the team's row (its keys, revoked, stay for the record); False if none."""

        async def op(db: Db) -> bool:
            return await db.execute("DELETE FROM teams WHERE id = ?", team_id) == 1

        return await self._store.run(op)

    async def update_team_limits(self, team_id: str, limits: dict[str, Any] | None) -> Team | None:
        async def op(db: Db) -> None:
            await db.execute(
                "UPDATE teams SET limits = ? WHERE id = ?", _encode("limits", limits), team_id
            )

        await self._store.run(op)
        return await self.team(team_id)
