"""What a store operation sees: a connection with four async methods, whatever the database.

Operations are written once, as `async def op(db: Db)`, in the SQL both databases accept, with
`?` placeholders. PostgreSQL runs them on the event loop through asyncpg. SQLite runs them on
its own thread: its methods never suspend, so `run_now` drives the coroutine to its end in one
step there, without an event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Protocol, TypeVar

T = TypeVar("T")

Dialect = Literal["sqlite", "postgresql"]
Row = tuple[Any, ...]


class Db(Protocol):
    dialect: Dialect

    async def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; the number of rows it changed."""
        ...

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> int | None:
        """One statement for many rows (much cheaper than a call per row); the number of rows
        it changed where the database says (SQLite), else None (asyncpg)."""
        ...

    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    async def fetchrow(self, sql: str, *args: Any) -> Row | None: ...

    async def fetchval(self, sql: str, *args: Any) -> Any: ...


Op = Callable[[Db], Awaitable[T]]


class StoreUnavailable(Exception):
    """The database cannot be reached or cannot write right now (down, locked, disk full).

    Writes survive it through the spool; a read that needs the database fails with 503."""


class ReadTimeout(Exception):
    """A bounded read (`Store.read`: a search, a list) ran past its time and was stopped."""


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Finish a coroutine that never awaits anything pending (SQLite operations)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a store operation awaited something outside its Db")
