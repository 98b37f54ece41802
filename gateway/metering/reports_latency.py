"""Latency percentiles of the usage records (`GET /v1/usage/latency`): per group, how many
attempts measured their time to first token and their duration, the p50, p95 and p99 of each by
nearest rank (a value an attempt had, never between two), and the mean.

Every value of the range has to be looked at. PostgreSQL keeps each whole UTC day's values of a
grouping of all teams sorted in a table (`usage_latency_days`, filled by the reports as
usage_days is): a report reads those arrays for the days filled, each other day's values sorted
by group in the same statement's other half, and merges them here. A team's report, a few of the
rows through the team's index, has PostgreSQL find them itself (`percentile_disc`). SQLite has
no percentile: its values are sorted here, on the read's own thread, and its whole days are kept
in memory, each group's values sorted (`SortedDays`): a report reads only the days not kept and
the part days at its ends, and merges the rest."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
from array import array
from collections import OrderedDict
from itertools import chain
from typing import Any

from gateway.storage.db import Db, Row
from gateway.storage.schema import USAGE_DAY
from gateway.storage.store import Store

log = logging.getLogger(__name__)

PERCENTILES = (50, 95, 99)
LATENCIES = ("ttft_ms", "duration_ms")
# How many values the kept days may hold in all (8 bytes each): every grouping of 90 days of
# about 190,000 attempts, with room to spare.
KEPT_VALUES = 4_000_000
_FILL_LOCK = 7426175  # pg_advisory_xact_lock: the fillers of usage_latency_days

Values = tuple[list[float], list[float]]  # one group's time to first token and duration values
Day = dict[Any, tuple["array[float]", "array[float]"]]  # group -> its values of a day, sorted


async def latency_rows(
    store: Store,
    days: SortedDays,
    *,
    column: str,
    start: float,
    end: float,
    team_id: str | None,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """The percentiles of the attempts in [start, end) by `column` (of one team, or of all),
    one record a group, ordered by group (none last); `ReadTimeout` past `timeout_s`."""
    team = " AND team_id = ?" if team_id is not None else ""
    args = [start, end, *([team_id] if team_id is not None else [])]
    by_day = store.dialect == "postgresql" and team_id is None
    if by_day:
        await _fill_days(store, column, start, end)

    async def op(db: Db) -> list[Row] | dict[Any, Values]:
        if db.dialect == "postgresql":
            # Each group's values sorted in memory, not in files.
            await db.execute("SET LOCAL work_mem = '64MB'")
            if by_day:
                return await _merged_days(db, column, start, end)
            return list(await db.fetch(_latency_postgres(column, team), *args))
        # A replayed write may change a row in place, which no rowid shows; and another
        # process's spool is not seen from here: then every value is read.
        if store.shared or store.spooled_bytes():
            days.forget()
            return _percentiles(await _values(db, column, start, end, team_id))
        return _percentiles(await days.values(db, column, start, end, team_id))

    read = await store.read(op, timeout_s)
    if isinstance(read, dict):  # sorted apart from the event loop, a group at a time
        read = await asyncio.to_thread(_percentiles, read)
    return _records(read)


def _dimension(column: str) -> str:
    """A grouping's name in usage_latency_days and usage_days_done."""
    return "latency:" + column.strip('"')


async def _merged_days(db: Db, column: str, start: float, end: float) -> dict[Any, Values]:
    """PostgreSQL: each group's values in [start, end), every day's sorted run one after
    another: the filled days' from usage_latency_days, the others' from the rows, in one
    snapshot (a day filled or dropped meanwhile read once)."""
    await db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    first, last = whole_days(start, end)
    dimension = _dimension(column)
    kept = [
        int(row[0])
        for row in await db.fetch(
            "SELECT DISTINCT day FROM usage_latency_days"
            " WHERE dimension = ? AND day >= ? AND day < ? ORDER BY day",
            dimension,
            first,
            last,
        )
    ]
    where, bounds = within(apart(start, end, kept))
    # Each group's runs in one text of doubles, as float8send writes them: no value is an
    # object until the merge.
    runs: dict[Any, tuple[list[bytes], list[bytes]]] = {}
    for group, ttft, duration in await db.fetch(
        "SELECT grp, string_agg(ttft, ''::bytea ORDER BY day),"
        " string_agg(duration, ''::bytea ORDER BY day) FROM usage_latency_days"
        " WHERE dimension = ? AND day >= ? AND day < ? GROUP BY grp"
        f" UNION ALL SELECT {column}, {_sorted_values('ttft_ms')},"
        f" {_sorted_values('duration_ms')} FROM usage WHERE {where} GROUP BY {column}",
        dimension,
        first,
        last,
        *bounds,
    ):
        parts = runs.setdefault(group, ([], []))
        parts[0].append(ttft)
        parts[1].append(duration)
    return {
        group: (_doubles(b"".join(ttft)), _doubles(b"".join(duration)))
        for group, (ttft, duration) in runs.items()
    }


def _sorted_values(name: str) -> str:
    """A group's values of latency `name`, sorted, as float8send writes each (8 bytes, the
    most significant first)."""
    return f"COALESCE(string_agg(float8send({name}), ''::bytea ORDER BY {name}), ''::bytea)"


def _doubles(data: bytes) -> list[float]:
    values = array("d")
    values.frombytes(data)
    if sys.byteorder == "little":
        values.byteswap()
    return values.tolist()


async def _fill_days(store: Store, column: str, start: float, end: float) -> None:
    """PostgreSQL: into usage_latency_days, the whole days of [start, end) that hold rows
    and are not there yet for this grouping, of those a report may fill (the day before
    yesterday and older, by the database's clock: a row written into one later drops it, by
    the trigger usage_days has), each day in a transaction of its own."""
    dimension = _dimension(column)

    async def missing(db: Db) -> list[int]:
        oldest, newest = await _bounds(db)
        if oldest is None or newest is None:
            return []
        now = float(await db.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
        first = max(math.ceil(start / USAGE_DAY), math.floor(oldest / USAGE_DAY))
        last = min(
            math.floor(end / USAGE_DAY),
            math.floor(newest / USAGE_DAY) + 1,
            math.floor(now / USAGE_DAY) - 1,
        )
        if first >= last:
            return []
        rows = await db.fetch(
            "SELECT day FROM usage_days_done WHERE dimension = ? AND day >= ? AND day < ?",
            dimension,
            first * USAGE_DAY,
            last * USAGE_DAY,
        )
        have = {int(row[0]) for row in rows}
        return [d * USAGE_DAY for d in range(first, last) if d * USAGE_DAY not in have]

    for day in await store.run(missing):

        async def fill(db: Db, day: int = day) -> None:
            # One filler at a time; and no usage row written into the day while its values
            # are read, which the trigger would miss. Not for long: a day left is read from
            # its rows.
            await db.execute("SET LOCAL lock_timeout = '1s'")
            await db.execute(f"SELECT pg_advisory_xact_lock({_FILL_LOCK})")
            await db.execute("LOCK TABLE usage IN SHARE MODE")
            if await db.fetchval(
                "SELECT 1 FROM usage_days_done WHERE day = ? AND dimension = ?", day, dimension
            ):
                return
            await db.execute(
                "DELETE FROM usage_latency_days WHERE dimension = ? AND day = ?", dimension, day
            )
            await db.execute(
                "INSERT INTO usage_latency_days (dimension, day, grp, ttft, duration)"
                f" SELECT CAST(? AS TEXT), CAST(? AS BIGINT), {column},"
                f" {_sorted_values('ttft_ms')}, {_sorted_values('duration_ms')}"
                f" FROM usage WHERE created_at >= ? AND created_at < ? GROUP BY {column}",
                dimension,
                day,
                day,
                day + USAGE_DAY,
            )
            await db.execute(
                "INSERT INTO usage_days_done (day, dimension) VALUES (?, ?)", day, dimension
            )

        try:
            await store.transact(fill)
        except Exception as exc:  # the days not filled are read from their rows
            log.warning("latency report: could not keep the values of day %d: %r", day, exc)
            return


def whole_days(start: float, end: float) -> tuple[int, int]:
    """The first and the end of the whole days in [start, end), as Unix seconds."""
    return math.ceil(start / USAGE_DAY) * USAGE_DAY, math.floor(end / USAGE_DAY) * USAGE_DAY


def apart(start: float, end: float, done: list[int]) -> list[tuple[float, float]]:
    """[start, end) without the days `done` (in order)."""
    ranges, at = [], start
    for day in done:
        if at < day:
            ranges.append((at, float(day)))
        at = max(at, day + USAGE_DAY)
    if at < end:
        ranges.append((at, end))
    return ranges


def within(ranges: list[tuple[float, float]]) -> tuple[str, list[Any]]:
    """A condition on created_at that holds in `ranges`, and its arguments."""
    if not ranges:
        return "1 = 0", []
    text = " OR ".join("(created_at >= ? AND created_at < ?)" for _ in ranges)
    return f"({text})", [bound for pair in ranges for bound in pair]


class SortedDays:
    """SQLite: whole UTC days' latencies, by grouping (and team), each group's values sorted,
    as a report read them. A day is forgotten once a row is inserted into it: a report first
    looks at the rows with a rowid above the last it saw, as the usage report does for its
    per-day sums (gateway.storage.schema). The least recently used days go past
    `KEPT_VALUES`."""

    def __init__(self, limit: int = KEPT_VALUES) -> None:
        self._limit = limit
        self._days: OrderedDict[tuple[str, str | None, int], Day] = OrderedDict()
        self._held = 0
        self._seen: int | None = None  # the highest rowid of usage looked at
        # Reads run on several threads; one at a time changes or reads what is kept.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many days are kept, of every grouping and team."""
        return len(self._days)

    def forget(self) -> None:
        with self._lock:
            self._days.clear()
            self._held = 0
            self._seen = None

    async def values(
        self, db: Db, column: str, start: float, end: float, team_id: str | None
    ) -> dict[Any, Values]:
        """Each group's values in [start, end): the whole days from what is kept (read first
        where missing), the part days at the ends from the table."""
        # The whole days of the range that hold rows: a range may run over centuries, and the
        # days before the first row and after the last are read (through the index) as ends.
        oldest, newest = await _bounds(db)
        if oldest is None or newest is None:
            return {}
        first = max(math.ceil(start / USAGE_DAY), math.floor(oldest / USAGE_DAY))
        last = min(math.floor(end / USAGE_DAY), math.floor(newest / USAGE_DAY) + 1)
        if first >= last:
            return await _values(db, column, start, end, team_id)
        merged: dict[Any, tuple[list[Any], list[Any]]] = {}
        with self._lock:
            await self._forget_changed(db)
            for day in await self._days_of(db, column, team_id, range(first, last)):
                for group, sorted_values in day.items():
                    parts = merged.setdefault(group, ([], []))
                    parts[0].append(sorted_values[0])
                    parts[1].append(sorted_values[1])
        for since, until in ((start, first * USAGE_DAY), (last * USAGE_DAY, end)):
            if since < until:
                for group, values in (await _values(db, column, since, until, team_id)).items():
                    parts = merged.setdefault(group, ([], []))
                    parts[0].append(values[0])
                    parts[1].append(values[1])
        # Sorted runs one after another: the sort merges them.
        return {
            group: (list(chain.from_iterable(ttft)), list(chain.from_iterable(duration)))
            for group, (ttft, duration) in merged.items()
        }

    async def _forget_changed(self, db: Db) -> None:
        """The kept days that rows were inserted into since the last look dropped."""
        newest = int(await db.fetchval("SELECT COALESCE(MAX(rowid), 0) FROM usage"))
        if self._seen is not None and newest > self._seen:
            rows = await db.fetch(
                f"SELECT DISTINCT CAST(created_at / {USAGE_DAY} AS INTEGER) FROM usage"
                " WHERE rowid > ?",
                self._seen,
            )
            changed = {int(row[0]) for row in rows}
            for key in [key for key in self._days if key[2] in changed]:
                self._drop(key)
        elif self._seen is not None and newest < self._seen:  # rows gone: nothing is known
            self._days.clear()
            self._held = 0
        self._seen = newest

    async def _days_of(self, db: Db, column: str, team_id: str | None, wanted: range) -> list[Day]:
        """The days `wanted` (numbers of UTC days), kept ones as they are, the others read
        (each run of consecutive days in one read) and kept."""
        found: dict[int, Day] = {}
        runs: list[list[int]] = []
        for d in wanted:
            key = (column, team_id, d)
            if key in self._days:
                self._days.move_to_end(key)
                found[d] = self._days[key]
            elif runs and runs[-1][-1] == d - 1:
                runs[-1].append(d)
            else:
                runs.append([d])
        for run in runs:
            read: dict[int, dict[Any, Values]] = {d: {} for d in run}
            rows = await _rows(
                db, column, run[0] * USAGE_DAY, (run[-1] + 1) * USAGE_DAY, team_id, with_day=True
            )
            for day, group, ttft, duration in rows:
                lists = read[int(day)].get(group)
                if lists is None:
                    lists = read[int(day)][group] = ([], [])
                if ttft is not None:
                    lists[0].append(ttft)
                if duration is not None:
                    lists[1].append(duration)
            for d, groups in read.items():
                found[d] = {
                    group: (array("d", sorted(ttft)), array("d", sorted(duration)))
                    for group, (ttft, duration) in groups.items()
                }
                self._keep((column, team_id, d), found[d])
        return [found[d] for d in wanted]

    def _keep(self, key: tuple[str, str | None, int], day: Day) -> None:
        self._days[key] = day
        self._held += _size(day)
        while self._held > self._limit and len(self._days) > 1:
            self._drop(next(iter(self._days)))

    def _drop(self, key: tuple[str, str | None, int]) -> None:
        self._held -= _size(self._days.pop(key))


def _size(day: Day) -> int:
    # A day without rows counts one: the number of days kept is bounded too.
    return max(1, sum(len(ttft) + len(duration) for ttft, duration in day.values()))


async def _rows(
    db: Db, column: str, start: float, end: float, team_id: str | None, *, with_day: bool = False
) -> list[Row]:
    """Each attempt's group and latencies in [start, end) (its UTC day first, `with_day`)."""
    team = " AND team_id = ?" if team_id is not None else ""
    # Through the time index for a part of the table; for most of it, one pass over the table
    # reads less than the index and then each of its rows by rowid besides. (A team's read
    # keeps its own index.)
    whole = team_id is None and await _most_of_usage(db, start, end)
    at = "+created_at" if whole else "created_at"
    day = f"CAST(created_at / {USAGE_DAY} AS INTEGER), " if with_day else ""
    return list(
        await db.fetch(
            f"SELECT {day}{column}, {', '.join(LATENCIES)} FROM usage"
            f" WHERE {at} >= ? AND {at} < ?{team}",
            start,
            end,
            *([team_id] if team_id is not None else []),
        )
    )


async def _values(
    db: Db, column: str, start: float, end: float, team_id: str | None
) -> dict[Any, Values]:
    """Each group's values in [start, end), in the table's order. The loop runs once an
    attempt, so it is written out for the two latencies (no zip, no list a row)."""
    values: dict[Any, Values] = {}
    for group, ttft, duration in await _rows(db, column, start, end, team_id):
        lists = values.get(group)
        if lists is None:
            lists = values[group] = ([], [])
        if ttft is not None:
            lists[0].append(ttft)
        if duration is not None:
            lists[1].append(duration)
    return values


async def _bounds(db: Db) -> tuple[float | None, float | None]:
    """The times of the oldest and the newest usage row, each read from the time index."""
    row = await db.fetchrow(
        "SELECT (SELECT MIN(created_at) FROM usage), (SELECT MAX(created_at) FROM usage)"
    )
    return (None, None) if row is None else (row[0], row[1])


async def _most_of_usage(db: Db, start: float, end: float) -> bool:
    """Whether [start, end) spans more than half the time the usage table covers (its rows
    come in time order, so about half its rows)."""
    first, last = await _bounds(db)
    if first is None or last is None or last <= first:
        return True
    return bool(min(end, last) - max(start, first) > (last - first) / 2)


def _percentiles(values: dict[Any, Values]) -> list[Row]:
    """SQLite's answer as PostgreSQL's: what `_latency_postgres` reads, from each group's
    values. Sorting in a window took SQLite six times as long as sorting here."""
    out: list[Row] = []
    for group, lists in values.items():
        row: list[Any] = [group]
        for ordered in lists:
            ordered.sort()
            mean = sum(ordered) / len(ordered) if ordered else None
            row += [len(ordered), [nearest_rank(ordered, p) for p in PERCENTILES], mean]
        out.append(tuple(row))
    return out


def _latency_postgres(column: str, team: str) -> str:
    """Per group, for each latency: how many attempts measured it, its percentiles and mean.
    `percentile_disc` is the nearest rank (`nearest_rank`), which it finds sorting each
    group's values alone."""
    fractions = ", ".join(f"{p / 100}" for p in PERCENTILES)
    each = ", ".join(
        f"COUNT({name}), percentile_disc(ARRAY[{fractions}]) WITHIN GROUP (ORDER BY {name}),"
        f" AVG({name})"
        for name in LATENCIES
    )
    return (
        f"SELECT {column}, {each} FROM usage WHERE created_at >= ? AND created_at < ?{team}"
        f" GROUP BY {column}"
    )


def nearest_rank(ordered: list[float], percentile: int) -> float | None:
    """The smallest of the values (in order) that at least `percentile`% of them reach: one
    an attempt had, never between two."""
    if not ordered:
        return None
    return ordered[math.ceil(percentile * len(ordered) / 100) - 1]


def _records(rows: list[Row]) -> list[dict[str, Any]]:
    """The percentiles' rows as one record a group, ordered by group (none last)."""
    records = []
    for group, *fields in rows:
        record: dict[str, Any] = {"group": group}
        for at, name in enumerate(LATENCIES):
            count, percentiles, mean = fields[3 * at : 3 * at + 3]
            picked = percentiles or [None] * len(PERCENTILES)
            record[name] = {
                "count": int(count),
                **{f"p{p}": _ms(v) for p, v in zip(PERCENTILES, picked, strict=True)},
                "mean": _ms(mean),
            }
        records.append(record)
    return sorted(records, key=lambda r: (r["group"] is None, str(r["group"])))


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
