"""The files and batches a team's keys made upstream, by the upstream's id (`api_objects`).

The upstream keeps the file or batch; the gateway keeps who owns it (the team, and the key that
made it), which deployment holds it (every later call on it goes there), the alias it was made
for, and the upstream's object as last seen (lists are answered from here: an upstream's own
list would show every team's). Written at once, not queued: a file is used right after its
upload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.storage.db import Db
from gateway.storage.store import Store

FILE = "file"
BATCH = "batch"


@dataclass
class Owned:
    id: str
    kind: str
    team_id: str | None
    key_id: str | None
    alias: str | None
    deployment: str
    created_at: float
    object: dict[str, Any]
    metered_at: float | None = None


def _owned(row: Any) -> Owned:
    id_, kind, team, key, alias, deployment, created, metered, obj = row
    return Owned(id_, kind, team, key, alias, deployment, created, orjson.loads(obj), metered)


_COLUMNS = "id, kind, team_id, key_id, alias, deployment, created_at, metered_at, object"


async def save(store: Store, owned: Owned) -> None:
    """Record an object the first time, or its latest upstream object (its owner stays)."""
    body = orjson.dumps(owned.object).decode()

    async def write(db: Db) -> None:
        await db.execute(
            "INSERT INTO api_objects (id, kind, team_id, key_id, alias, deployment, created_at,"
            " object) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET object = excluded.object",
            owned.id,
            owned.kind,
            owned.team_id,
            owned.key_id,
            owned.alias,
            owned.deployment,
            owned.created_at,
            body,
        )

    await store.run(write)


async def get(store: Store, kind: str, object_id: str) -> Owned | None:
    async def read(db: Db) -> Any:
        return await db.fetchrow(
            f"SELECT {_COLUMNS} FROM api_objects WHERE id = ? AND kind = ? AND deleted_at IS NULL",
            object_id,
            kind,
        )

    row = await store.run(read)
    return _owned(row) if row is not None else None


async def listed(
    store: Store, kind: str, team_id: str | None, *, limit: int, after: str | None, newest: bool
) -> tuple[list[Owned], bool]:
    """A team's objects (every team's for None), in creation order, after the object `after`,
    and whether more follow."""
    where, args = ["kind = ?", "deleted_at IS NULL"], [kind]
    if team_id is not None:
        where.append("team_id = ?")
        args.append(team_id)

    async def read(db: Db) -> list[Any]:
        clauses, values = list(where), list(args)
        if after is not None:
            mark = await db.fetchrow("SELECT created_at FROM api_objects WHERE id = ?", after)
            if mark is not None:
                op = "<" if newest else ">"
                clauses.append(f"(created_at {op} ? OR (created_at = ? AND id {op} ?))")
                values += [mark[0], mark[0], after]
        order = "DESC" if newest else "ASC"
        return list(
            await db.fetch(
                f"SELECT {_COLUMNS} FROM api_objects WHERE {' AND '.join(clauses)}"
                f" ORDER BY created_at {order}, id {order} LIMIT {int(limit) + 1}",
                *values,
            )
        )

    rows = [_owned(r) for r in await store.run(read)]
    return rows[:limit], len(rows) > limit


async def deleted(store: Store, object_id: str) -> None:
    async def write(db: Db) -> None:
        await db.execute(
            "UPDATE api_objects SET deleted_at = ? WHERE id = ?", time.time(), object_id
        )

    await store.run(write)


async def metered(store: Store, object_id: str) -> bool:
    """Mark a batch metered; False when it already was (another request, or replica, did)."""

    async def write(db: Db) -> bool:
        row = await db.fetchrow(
            "UPDATE api_objects SET metered_at = ? WHERE id = ? AND metered_at IS NULL"
            " RETURNING id",
            time.time(),
            object_id,
        )
        return row is not None

    return await store.run(write)
