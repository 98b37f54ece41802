"""PostgreSQL backend (asyncpg): what several replicas share.

Operations run on the event loop over a small pool. A batch of writes is one transaction; two
replicas appending to one conversation at the same moment collide on its next `seq`, and the
loser's batch is retried by the store, one write at a time.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any, TypeVar

import asyncpg

from gateway.errors import InvalidRequest
from gateway.storage.db import Dialect, Op, ReadTimeout, Row, StoreUnavailable
from gateway.storage.writes import Write, apply_batch

T = TypeVar("T")

_ACQUIRE_TIMEOUT_S = 5.0
_COMMAND_TIMEOUT_S = 15.0
_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash shutdown
    asyncpg.exceptions.InsufficientResourcesError,  # disk full, too many connections
)


def _unstorable() -> InvalidRequest:
    # PostgreSQL text cannot hold NUL: an id, name or filter from a client carrying one failed
    # every query it reached with a 500. (JSON payloads are stored escaped and are unaffected.)
    return InvalidRequest("A value in the request contains a NUL character (\\u0000).")


@functools.lru_cache(maxsize=512)
def numbered(sql: str) -> str:
    """`?` placeholders as `$1, $2, ...` (the SQL here never has a `?` inside a literal)."""
    counter = iter(range(1, 10_000))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


class _Connection:
    dialect: Dialect = "postgresql"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: Any) -> int:
        status = await self._conn.execute(numbered(sql), *args)
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> int | None:
        await self._conn.executemany(numbered(sql), rows)
        return None  # asyncpg does not say

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return [tuple(r) for r in await self._conn.fetch(numbered(sql), *args)]

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        row = await self._conn.fetchrow(numbered(sql), *args)
        return None if row is None else tuple(row)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._conn.fetchval(numbered(sql), *args)


class PostgresBackend:
    dialect: Dialect = "postgresql"

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.pool_size = pool_size
        self._pool: asyncpg.Pool | None = None

    @property
    def where(self) -> str:
        return re.sub(r"//[^@/]*@", "//***@", self.url)  # never log the password

    async def start(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=1,
                max_size=self.pool_size,
                command_timeout=_COMMAND_TIMEOUT_S,
                timeout=_ACQUIRE_TIMEOUT_S,
            )
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL at {self.where}: {exc}") from exc

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), 5)
            except (TimeoutError, *_UNAVAILABLE):
                pool.terminate()

    async def run(self, op: Op[T]) -> T:
        assert self._pool is not None, "store not started"
        try:
            async with self._pool.acquire(timeout=_ACQUIRE_TIMEOUT_S) as conn:
                return await op(_Connection(conn))
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL: {exc!r}") from exc
        except asyncpg.exceptions.CharacterNotInRepertoireError as exc:
            raise _unstorable() from exc

    async def transact(self, op: Op[T]) -> T:
        assert self._pool is not None, "store not started"
        try:
            async with (
                self._pool.acquire(timeout=_ACQUIRE_TIMEOUT_S) as conn,
                conn.transaction(),
            ):
                return await op(_Connection(conn))
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL: {exc!r}") from exc
        except asyncpg.exceptions.CharacterNotInRepertoireError as exc:
            raise _unstorable() from exc

    async def read(self, op: Op[T], timeout_s: float, *, search: bool = False) -> T:
        """`op` in a transaction whose statements PostgreSQL cancels past `timeout_s`
        (`statement_timeout`, for this transaction alone), waiting for a connection included."""
        assert self._pool is not None, "store not started"
        deadline = time.monotonic() + timeout_s
        try:
            async with (
                self._pool.acquire(timeout=min(timeout_s, _ACQUIRE_TIMEOUT_S)) as conn,
                conn.transaction(readonly=True),
            ):
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                await conn.execute(f"SET LOCAL statement_timeout = {left_ms}")
                return await op(_Connection(conn))
        except asyncpg.exceptions.QueryCanceledError as exc:
            raise ReadTimeout("the read ran past its deadline") from exc
        except _UNAVAILABLE as exc:
            if time.monotonic() >= deadline:
                raise ReadTimeout("the read waited past its deadline for a connection") from exc
            raise StoreUnavailable(f"PostgreSQL: {exc!r}") from exc
        except asyncpg.exceptions.CharacterNotInRepertoireError as exc:
            raise _unstorable() from exc

    async def apply(self, writes: list[Write]) -> None:
        async def op(db: Any) -> None:
            await apply_batch(db, writes)

        await self.transact(op)

    async def ping(self) -> None:
        async def select(db: Any) -> Any:
            return await db.fetchval("SELECT 1")

        await self.run(select)
