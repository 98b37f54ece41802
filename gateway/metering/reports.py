"""Usage records in the store, and the grouped reports read from them."""

from __future__ import annotations

import csv
import io
import logging
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.metering.reports_latency import SortedDays, latency_rows
from gateway.metering.reports_latency import apart as _apart
from gateway.metering.reports_latency import whole_days as _whole_days
from gateway.metering.reports_latency import within as _within
from gateway.metering.usage import UsageRecord
from gateway.storage.db import Db, Dialect, Op, Row
from gateway.storage.schema import USAGE_DAY, USAGE_DAY_COUNTS, USAGE_LATER, usage_day_of
from gateway.storage.store import Store

T = TypeVar("T")
log = logging.getLogger(__name__)

GROUPS = {
    "team": "team_id",
    "key": "key_id",
    "user": '"user"',
    "model": "alias",
    "deployment": "deployment",
}
GRANULARITY = {"hour": 3600, "day": 86400}
# A grouping's name in usage_days_done for its sums by hour (usage_hours).
HOURS = "hour:"
# `group_by=tag:<key>`: the value of one key of the requests' metadata (a usage row's `tags`).
TAG_PREFIX = "tag:"
TAG_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# What each field of a report row means (docs/api.md, "Usage reports"). Counts of requests are
# turns (an embeddings call is one too), each counted once, in the group and period of its last
# attempt (for `deployment`: the deployment that answered, or last failed); attempts, tokens and
# cost belong to the attempt that made them. Every count of requests is at most `requests`, and
# `failed_attempts` at most `attempts`, so no rate made of them passes 100%.
COLUMNS = [
    "period_start",
    "group",
    "requests",  # turns
    "attempts",  # upstream attempts, the first included
    "failed_attempts",  # attempts that failed (retried, or the request's error)
    "interrupted",  # turns whose answer was cut short by the client
    "errors",  # turns that ended in an error
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "reasoning_tokens",
    "cached_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "estimated",  # turns with an attempt metered by estimate
    "unpriced_requests",  # turns with an attempt on an unpriced deployment (cost unknown)
    "unpriced_prompt_tokens",  # the tokens of those attempts, which cost_usd leaves out
    "unpriced_completion_tokens",
    "cost_usd",  # the priced attempts' cost; null when none is priced
]
# Cells a spreadsheet would run as a formula when they start with one of these.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class UsageStore:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._sorted_days = SortedDays()  # SQLite's latencies of whole days (reports_latency)

    def write(self, record: UsageRecord) -> None:
        # A call's row has columns a turn's attempt never fills: written by the longer insert.
        self._store.write("usage" if record.endpoint is None else "call", record.row())

    async def spent(self, kind: str, ident: str, since: float) -> float:
        """USD recorded for a key or team, or an end user under one (`key.user`, `team.user`:
        the ident `<id>:<user>`), since a time (what a budget has used). A row of negative
        cost, whoever wrote it, never gives a budget back what it spent."""
        column = "key_id" if kind.startswith("key") else "team_id"
        owner, _, user = ident.partition(":") if kind.endswith(".user") else (ident, "", "")
        of_user = ' AND "user" = ?' if user else ""
        args = (owner, since, user) if user else (owner, since)

        async def op(db: Db) -> float:
            value = await db.fetchval(
                f"SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE {column} = ?"
                f" AND created_at >= ? AND cost_usd > 0{of_user}",
                *args,
            )
            return float(value)

        return await self._store.run(op)

    async def report(
        self,
        *,
        group_by: str,
        start: float,
        end: float,
        granularity: str,
        team_id: str | None,
    ) -> list[dict[str, Any]]:
        bucket = GRANULARITY[granularity]
        if group_by.startswith(TAG_PREFIX):
            return await self._tag_report(group_by[len(TAG_PREFIX) :], start, end, bucket, team_id)
        column = GROUPS[group_by]
        summed = self._store.dialect == "postgresql" or not self._store.shared
        if bucket != USAGE_DAY and (team_id is not None or not summed):
            # A team's hours: a few of the rows, through the team's index.

            async def hours(db: Db) -> list[dict[str, Any]]:
                sql, args = _report_sql(db.dialect, column, bucket, [(start, end)], team_id)
                return _records(await db.fetch(sql, *args))[0]

            return await self._store.run(hours)
        if summed:
            await self._fill_days(group_by, column, start, end, hourly=bucket != USAGE_DAY)
        # A team's rows, or those for all teams, which are fewer (a user in many teams); by
        # hour, those for all teams alone are kept.
        dimension = group_by if team_id is not None else group_by + "*"
        if bucket != USAGE_DAY:
            dimension = HOURS + dimension

        async def days(db: Db) -> list[dict[str, Any]]:
            first, last = _whole_days(start, end)
            done: list[int] = []
            if summed:
                filled = await db.fetch(
                    "SELECT d.day FROM usage_days_done d WHERE d.dimension = ? AND d.day >= ?"
                    " AND d.day < ? AND EXISTS (SELECT 1 FROM usage_days_done t"
                    " WHERE t.day = d.day AND t.dimension = 'turns') ORDER BY d.day",
                    dimension,
                    first,
                    last,
                )
                late = await _late_days(db) if db.dialect == "sqlite" else set()
                done = [int(row[0]) for row in filled if int(row[0]) not in late]
            ranges = _apart(start, end, done)
            read = (dimension, done[0], done[-1] + USAGE_DAY) if done else None
            sql, args = _report_sql(db.dialect, column, bucket, ranges, team_id, read, by_day=True)
            records, by_key = _records(await db.fetch(sql, *args))
            span, days = (start, end), (first, last)
            await _across_days(db, by_key, column, span, team_id, days, ranges, bucket)
            return records

        return await self._in_snapshot(days)

    async def latency(
        self, *, group_by: str, start: float, end: float, team_id: str | None, timeout_s: float
    ) -> list[dict[str, Any]]:
        """Time to first token and duration percentiles (nearest rank) and means of the
        attempts in [start, end), per group (`GROUPS`): a long read, out of the writer's way
        (`ReadTimeout` past `timeout_s`)."""
        return await latency_rows(
            self._store,
            self._sorted_days,
            column=GROUPS[group_by],
            start=start,
            end=end,
            team_id=team_id,
            timeout_s=timeout_s,
        )

    async def report_by_team(
        self, *, group_by: str, start: float, end: float, granularity: str
    ) -> list[dict[str, Any]]:
        """The report of every team with each group's rows apart for each team (`team_id` on
        every row: the team, or None): read from the usage rows alone, as a tag's report is,
        since usage_days sums each grouping of every team together."""
        tag = group_by[len(TAG_PREFIX) :] if group_by.startswith(TAG_PREFIX) else None

        def column(dialect: Dialect) -> str:
            # The team and the group in one text: team ids hold no '|' (key_store), and a
            # group is marked present with '=' so that None stays apart from ''.
            inner = _tag_column(dialect, tag) if tag is not None else GROUPS[group_by]
            return (
                f"(COALESCE(team_id, '') || '|' || CASE WHEN {inner} IS NULL THEN ''"
                f" ELSE '=' || CAST({inner} AS TEXT) END)"
            )

        records = await self._raw_report(column, start, end, GRANULARITY[granularity], None)
        for record in records:
            team, _, group = record["group"].partition("|")
            record["group"] = group[1:] if group else None
            record["team_id"] = team or None
        return records

    async def _tag_report(
        self, key: str, start: float, end: float, bucket: int, team_id: str | None
    ) -> list[dict[str, Any]]:
        """Grouped by one metadata tag: read from the usage rows alone (usage_days keeps no
        tag), by the same rules as every other grouping."""
        return await self._raw_report(
            lambda dialect: _tag_column(dialect, key), start, end, bucket, team_id
        )

    async def _raw_report(
        self,
        column_of: Callable[[Dialect], str],
        start: float,
        end: float,
        bucket: int,
        team_id: str | None,
    ) -> list[dict[str, Any]]:
        """Grouped by a column's expression (`column_of` the store's dialect), from the usage
        rows alone, by the same rules as every other grouping."""

        async def op(db: Db) -> list[dict[str, Any]]:
            column = column_of(db.dialect)
            sql, args = _report_sql(db.dialect, column, bucket, [(start, end)], team_id)
            records, by_key = _records(await db.fetch(sql, *args))
            if bucket == USAGE_DAY:  # a turn with attempts on several days counted once
                first = _whole_days(start, end)[0]
                span = (start, end)
                await _across_days(db, by_key, column, span, team_id, (first, first), [span])
            return records

        return await self._in_snapshot(op)

    async def _in_snapshot(self, op: Op[T]) -> T:
        """`op` reading one state of the store throughout: which days are filled, and the
        rows it reads for the others."""
        if self._store.dialect == "postgresql":

            async def repeatable(db: Db) -> T:
                await db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                # A plan for the times asked: one made for any (the connection's prepared
                # statement, after a few runs) reads a day as it would read a year.
                await db.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                # The answer's rows sorted in memory: 90 days by hour or by key, some 20,000
                # rows, went to disk at the default 4 MB. A larger setting is kept.
                await db.execute(
                    "SELECT set_config('work_mem', GREATEST(setting::bigint, ?)::text || 'kB',"
                    " true) FROM pg_settings WHERE name = 'work_mem'",
                    _SORT_KB,
                )
                return await op(db)

            return await self._store.transact(repeatable)

        async def deferred(db: Db) -> T:
            # A read transaction: in WAL mode it keeps no other process's writer waiting, as
            # the store's BEGIN IMMEDIATE would.
            await db.execute("BEGIN")
            try:
                value = await op(db)
            except BaseException:
                await db.execute("ROLLBACK")
                raise
            await db.execute("COMMIT")
            return value

        return await self._store.run(deferred)

    async def _fill_days(
        self, group_by: str, column: str, start: float, end: float, *, hourly: bool = False
    ) -> None:
        """Into usage_days (usage_hours, `hourly`), the whole days of [start, end) not there
        yet for this grouping, of those a report may fill (`_fillable_until`), each day in a
        transaction of its own. On SQLite, first the days of the rows inserted since a report
        last looked dropped; and none filled while writes wait in the spool
        (gateway.storage.schema)."""
        first, last = _whole_days(start, end)
        if first >= last:
            return
        if self._store.dialect == "sqlite":
            if await self._store.run(_late_days):
                await self._store.transact(_forget_late_days)
            if self._store.spooled_bytes():
                return
        sums = [HOURS + group_by + "*"] if hourly else [group_by, group_by + "*"]
        wanted = {*sums, "turns"}

        async def missing(db: Db) -> list[int]:
            until = min(last, await _fillable_until(db))
            if until <= first:
                return []
            rows = await db.fetch(
                "SELECT day, dimension FROM usage_days_done WHERE day >= ? AND day < ?",
                first,
                until,
            )
            have: dict[int, set[str]] = {}
            for day, dimension in rows:
                have.setdefault(int(day), set()).add(dimension)
            return [d for d in range(first, until, USAGE_DAY) if not wanted <= have.get(d, set())]

        for day in await self._store.run(missing):

            async def fill(db: Db, day: int = day) -> None:
                await _fill_day(db, day, group_by, column, hourly=hourly)

            try:
                await self._store.transact(fill)
            except Exception as exc:  # the days not summed are read from their records
                log.warning("usage report: could not sum the usage of %s: %r", _date(day), exc)
                return


def _tag_column(dialect: Dialect, key: str) -> str:
    """The value of one key of a usage row's tags. `key` must match `TAG_KEY`, so that it
    can be written into the query."""
    if not TAG_KEY.match(key):
        raise ValueError(f"not a tag key: {key!r}")
    if dialect == "sqlite":
        return f"json_extract(tags, '$.\"{key}\"')"
    return f"(CAST(tags AS jsonb) ->> '{key}')"


_FILL_LOCK = 7426174  # pg_advisory_xact_lock: the fillers of usage_days
_SORT_KB = 32 * 1024  # PostgreSQL's work_mem for a report, at least
_NOW = {
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
    "postgresql": "SELECT extract(epoch FROM clock_timestamp())",
}
_SUMMED = (*USAGE_DAY_COUNTS, "cost_usd")
_COUNTS = ", ".join(USAGE_DAY_COUNTS)
# What a turn's count of requests moves with: its attempts as read for that.
_FIELDS = (
    "id, turn_id, team_id, created_at, {column}, status, usage_source, cost_usd, prompt_tokens,"
    " completion_tokens"
)
_ESTIMATED = "usage_source <> 'provider' AND prompt_tokens + completion_tokens > 0"


async def _late_days(db: Db) -> set[int]:
    """SQLite: the days of the usage rows inserted since a report last looked."""
    rows = await db.fetch(
        f"SELECT DISTINCT {usage_day_of('sqlite', 'created_at')} FROM usage"
        " WHERE rowid > (SELECT last_rowid FROM usage_days_seen)"
    )
    return {int(row[0]) for row in rows}


async def _forget_late_days(db: Db) -> None:
    """SQLite: the days of the usage rows inserted since a report last looked dropped from
    usage_days (those filled), and the rows looked at."""
    for day in await _late_days(db):
        for table in ("usage_days", "usage_hours", "usage_days_turns", "usage_days_done"):
            await db.execute(f"DELETE FROM {table} WHERE day = ?", day)
    await db.execute(
        "UPDATE usage_days_seen SET last_rowid = (SELECT COALESCE(MAX(rowid), 0) FROM usage)"
    )


async def _fillable_until(db: Db) -> int:
    """The end of the days a report may fill: those before yesterday, by the database's
    clock, into which a row written is noticed (gateway.storage.schema)."""
    now = float(await db.fetchval(_NOW[db.dialect]))
    return int(now // USAGE_DAY) * USAGE_DAY - USAGE_DAY


async def _fill_day(db: Db, day: int, group_by: str, column: str, *, hourly: bool) -> None:
    """One day's rows of usage_days for a grouping (per team, and for all teams), or of
    usage_hours (`hourly`: for all teams), and its turns with attempts on other days, those
    not there yet."""
    if db.dialect == "postgresql":
        # One filler at a time; and no usage row written into the day while its sums are
        # taken, which the triggers would miss (a row not yet committed drops no day not
        # yet filled). Not for long: a day left is read from its records.
        await db.execute("SET LOCAL lock_timeout = '1s'")
        await db.execute(f"SELECT pg_advisory_xact_lock({_FILL_LOCK})")
        await db.execute("LOCK TABLE usage IN SHARE MODE")
    rows = await db.fetch("SELECT dimension FROM usage_days_done WHERE day = ?", day)
    have = {row[0] for row in rows}
    bounds = [day, day + USAGE_DAY]
    later = USAGE_LATER[db.dialect]
    hours = HOURS + group_by + "*"
    if hourly and hours not in have:
        await db.execute("DELETE FROM usage_hours WHERE dimension = ? AND day = ?", hours, day)
        # What a report by hour of this day alone says, for all teams.
        sql, args = _report_sql(db.dialect, column, 3600, [(day, day + USAGE_DAY)], None)
        await db.execute(
            f"INSERT INTO usage_hours (dimension, day, hour, grp, {_COUNTS}, cost_usd)"
            f" SELECT CAST(? AS TEXT), CAST(? AS BIGINT), x.* FROM ({sql}) x",
            hours,
            day,
            *args,
        )
        await db.execute("INSERT INTO usage_days_done (day, dimension) VALUES (?, ?)", day, hours)
    if not hourly and not {group_by, group_by + "*"} <= have:
        for dimension in (group_by, group_by + "*"):
            await db.execute(
                "DELETE FROM usage_days WHERE dimension = ? AND day = ?", dimension, day
            )
            await db.execute(
                "DELETE FROM usage_days_done WHERE day = ? AND dimension = ?", day, dimension
            )
        # What a report of this day alone says, per team.
        main = (
            f"SELECT team_id, {column}, {_row_sums(db.dialect)} FROM usage"
            f" WHERE created_at >= ? AND created_at < ? GROUP BY team_id, {column}"
        )
        within = "created_at >= ? AND created_at < ?"
        moves = _moves_sql(db.dialect, column, within, "", "NULL", by_day=False)
        sums = ", ".join(f"SUM({name})" for name in _SUMMED)
        await db.execute(
            f"WITH later AS ({_later(db.dialect, column, within)}),"
            f" p (team_id, grp, {_COUNTS}, cost_usd) AS ({main} UNION ALL"
            f" {moves.replace('{keys}', 'team_id, grp')})"
            f" INSERT INTO usage_days (dimension, day, team_id, grp, {_COUNTS}, cost_usd)"
            f" SELECT CAST(? AS TEXT), CAST(? AS BIGINT), team_id, grp, {sums} FROM p"
            " GROUP BY team_id, grp",
            *bounds,
            *bounds,
            *bounds,
            group_by,
            day,
        )
        await db.execute(
            f"INSERT INTO usage_days (dimension, day, team_id, grp, {_COUNTS}, cost_usd)"
            f" SELECT CAST(? AS TEXT), day, NULL, grp, {sums} FROM usage_days WHERE dimension = ?"
            " AND day = ? GROUP BY day, grp",
            group_by + "*",
            group_by,
            day,
        )
        for dimension in (group_by, group_by + "*"):
            await db.execute(
                "INSERT INTO usage_days_done (day, dimension) VALUES (?, ?)", day, dimension
            )
    if "turns" not in have:
        # A turn whose first attempt is not this day's has attempts on another day too (or
        # none other in the store).
        await db.execute(
            "INSERT INTO usage_days_turns (day, turn_id)"
            " SELECT DISTINCT CAST(? AS BIGINT), l.turn_id"
            f" FROM usage l WHERE {later} AND l.created_at >= ? AND l.created_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM usage h WHERE h.id = l.turn_id || ':1'"
            " AND h.created_at >= ? AND h.created_at < ?)",
            day,
            *bounds,
            *bounds,
        )
        await db.execute("INSERT INTO usage_days_done (day, dimension) VALUES (?, 'turns')", day)


def _date(day: int) -> str:
    return datetime.fromtimestamp(day, UTC).date().isoformat()


def _head(dialect: Dialect) -> str:
    """A usage row that is the first attempt of its turn, or an API call."""
    return f"NOT ({USAGE_LATER[dialect]})"


def _later(dialect: Dialect, column: str, within: str, team: str = "") -> str:
    """The attempts after their turn's first, `within` (and of the team)."""
    fields = _FIELDS.format(column=f"{column} AS grp")
    return f"SELECT {fields} FROM usage WHERE {USAGE_LATER[dialect]} AND {within}{team}"


def _row_sums(dialect: Dialect) -> str:
    """Each report count over usage rows (USAGE_DAY_COUNTS, then cost): every attempt's
    own; the counts of requests of the rows that begin a turn (`_moves_sql` moves them)."""
    head = _head(dialect)
    return (
        f"SUM(CASE WHEN {head} THEN 1 ELSE 0 END), COUNT(*),"
        " SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {head} AND status = 'interrupted' THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {head} AND status = 'error' THEN 1 ELSE 0 END),"
        " SUM(prompt_tokens), SUM(completion_tokens), SUM(completion_delivered),"
        " SUM(reasoning_tokens), SUM(cached_tokens), SUM(COALESCE(cache_write_5m_tokens, 0)),"
        " SUM(COALESCE(cache_write_1h_tokens, 0)),"
        f" SUM(CASE WHEN {head} AND {_ESTIMATED} THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {head} AND cost_usd IS NULL THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN cost_usd IS NULL THEN prompt_tokens ELSE 0 END),"
        " SUM(CASE WHEN cost_usd IS NULL THEN completion_tokens ELSE 0 END),"
        " SUM(cost_usd)"
    )


def _moves_sql(
    dialect: Dialect, column: str, within: str, team: str, period: str, by_day: bool
) -> str:
    """Each turn with an attempt after its first (`later`, read `within`, and of the team),
    its request and what counts with it moved from its first attempt, where `_row_sums`
    counted them, to its last; whether any of its attempts was unpriced or estimated, counted
    there. `by_day`: each day's attempts of a turn as a turn of their own, as a report of
    that day alone counts them. Grouped by `{keys}` (of period, team_id, grp), left to fill
    in."""
    # Numbered attempts sort as numbers: by the length of the id, then the id itself.
    order = "LENGTH(id) DESC, " + ('id COLLATE "C" DESC' if dialect == "postgresql" else "id DESC")
    partition = f"turn_id, {usage_day_of(dialect, 'created_at')}" if by_day else "turn_id"
    attempts = (
        f"SELECT * FROM later UNION ALL SELECT {_FIELDS.format(column=column)} FROM usage"
        f" WHERE id IN (SELECT turn_id || ':1' FROM later) AND {within}{team}"
    )
    turns = (
        f"SELECT {period} AS period, team_id, grp, status, cost_usd,"
        f" CASE WHEN {_head(dialect)} THEN 1 ELSE 0 END AS head,"
        f" CASE WHEN {_ESTIMATED} THEN 1 ELSE 0 END AS own_estimated,"
        f" ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) AS k,"
        f" MAX(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END) OVER (PARTITION BY {partition})"
        " AS unpriced,"
        f" MAX(CASE WHEN {_ESTIMATED} THEN 1 ELSE 0 END) OVER (PARTITION BY {partition})"
        f" AS estimated FROM ({attempts}) x"
    )

    def moved(condition: str) -> str:
        return (
            f"SUM(CASE WHEN k = 1 AND {condition} THEN 1 ELSE 0 END"
            f" - CASE WHEN head = 1 AND {condition} THEN 1 ELSE 0 END)"
        )

    interrupted, errors = moved("status = 'interrupted'"), moved("status = 'error'")
    return (
        "SELECT {keys}, SUM(CASE WHEN k = 1 THEN 1 ELSE 0 END - head), 0, 0,"
        f" {interrupted}, {errors}, 0, 0, 0, 0, 0, 0, 0,"
        " SUM(CASE WHEN k = 1 THEN estimated ELSE 0 END - head * own_estimated),"
        " SUM(CASE WHEN k = 1 THEN unpriced ELSE 0 END"
        " - CASE WHEN head = 1 AND cost_usd IS NULL THEN 1 ELSE 0 END),"
        " 0, 0, CAST(NULL AS DOUBLE PRECISION)"
        f" FROM ({turns}) r GROUP BY {{keys}}"
    )


def _report_sql(
    dialect: Dialect,
    column: str,
    bucket: int,
    ranges: list[tuple[float, float]],
    team_id: str | None,
    read: tuple[str, int, int] | None = None,
    *,
    by_day: bool = False,
) -> tuple[str, list[Any]]:
    """The report's rows from usage rows in `ranges`, and (`read`: a dimension and its first
    and end day) the days in usage_days (by hour: in usage_hours, all teams'). By day, or
    `by_day`, each day's attempts of a turn count as a turn of their own, as in usage_days:
    `_across_days` counts the turns of several days."""
    team = " AND team_id = ?" if team_id is not None else ""
    teams = [team_id] if team_id is not None else []
    floor = "FLOOR" if dialect == "postgresql" else ""
    # Truncated to the bucket: SQLite's integer CAST truncates, PostgreSQL's rounds.
    period = f"CAST({floor}(created_at / {bucket}) AS BIGINT) * {bucket}"
    within, bounds = _within(ranges)
    args: list[Any] = [*bounds, *teams]
    parts = []
    for low, high in ranges:
        parts.append(
            f"SELECT {period}, {column}, {_row_sums(dialect)} FROM usage"
            f" WHERE created_at >= ? AND created_at < ?{team} GROUP BY 1, 2"
        )
        args += [low, high, *teams]
    moves = _moves_sql(dialect, column, within, team, period, by_day or bucket == USAGE_DAY)
    parts.append(moves.replace("{keys}", "period, grp"))
    args += [*bounds, *teams]
    # Integers from PostgreSQL's sums too, which are numeric.
    sums = ", ".join(f"CAST(SUM({name}) AS BIGINT)" for name in USAGE_DAY_COUNTS)
    sql = (
        f"WITH later AS ({_later(dialect, column, within, team)}),"
        f" p (period, grp, {_COUNTS}, cost_usd) AS ({' UNION ALL '.join(parts)})"
        f" SELECT period, grp, {sums}, SUM(cost_usd) FROM p GROUP BY period, grp"
    )
    if read is not None:
        # A day filled holds one row a group (of one team, or of all), in the report's order;
        # and no usage row of it is read above.
        dimension, first, end_day = read
        if bucket == USAGE_DAY:
            sql += (
                f" UNION ALL SELECT day, grp, {_COUNTS}, cost_usd FROM usage_days"
                f" WHERE dimension = ? AND team_id {'= ?' if team_id is not None else 'IS NULL'}"
                " AND day >= ? AND day < ?"
            )
            args += [dimension, *teams, first, end_day]
        else:
            sql += (
                f" UNION ALL SELECT hour, grp, {_COUNTS}, cost_usd FROM usage_hours"
                " WHERE dimension = ? AND hour >= ? AND hour < ?"
            )
            args += [dimension, first, end_day]
    return sql + " ORDER BY 1, 2", args


# A report's records by period (Unix seconds), then group.
Index = dict[int, dict[Any, dict[str, Any]]]


def _records(rows: list[Row]) -> tuple[list[dict[str, Any]], Index]:
    """The report's rows as records, and each by its period and group. Indexed without a
    tuple a record: records of plain values are left out of the garbage collector's walks, a
    tuple is not."""
    out = []
    periods: dict[int, tuple[str, dict[Any, dict[str, Any]]]] = {}
    # A dict display with the keys written out is built at once, keys hashed in advance: a
    # report by key over months is 18,000 of them, and dict(zip(COLUMNS, row)) took twice as
    # long. tests/metering/test_report_days.py holds its keys to COLUMNS, in order.
    for (
        period, group, requests, attempts, failed, interrupted, errors, prompt, completion,
        delivered, reasoning, cached, write_5m, write_1h, estimated, unpriced, unpriced_prompt,
        unpriced_completion, cost,
    ) in rows:  # fmt: skip
        seen = periods.get(period)
        if seen is None:
            seen = periods[period] = (datetime.fromtimestamp(period, UTC).isoformat(), {})
        start, groups = seen
        groups[group] = record = {
            "period_start": start,
            "group": group,
            "requests": requests,
            "attempts": attempts,
            "failed_attempts": failed,
            "interrupted": interrupted,
            "errors": errors,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "completion_delivered": delivered,
            "reasoning_tokens": reasoning,
            "cached_tokens": cached,
            "cache_write_5m_tokens": write_5m,
            "cache_write_1h_tokens": write_1h,
            "estimated": estimated,
            "unpriced_requests": unpriced,
            "unpriced_prompt_tokens": unpriced_prompt,
            "unpriced_completion_tokens": unpriced_completion,
            "cost_usd": None if cost is None else round(cost, 10),
        }
        out.append(record)
    return out, {int(period): groups for period, (_, groups) in periods.items()}


async def _across_days(
    db: Db,
    by_key: Index,
    column: str,
    span: tuple[float, float],
    team_id: str | None,
    days: tuple[int, int],
    ranges: list[tuple[float, float]],
    bucket: int = USAGE_DAY,
) -> None:
    """Each turn with attempts on more than one day of the report counted once, at its last
    attempt (in the report's period of `bucket` seconds), rather than on each day as a report
    of each day alone counts it: the turns
    usage_days_turns names for the days filled (`days`, at most), and those with an attempt
    after their first in `ranges`, read from their attempts in `span`."""
    team = " AND team_id = ?" if team_id is not None else ""
    teams = [team_id] if team_id is not None else []
    within, bounds = _within(ranges)
    later = USAGE_LATER[db.dialect]
    fields = _FIELDS.format(column=column)
    rows = await db.fetch(
        "WITH c AS (SELECT turn_id FROM usage_days_turns WHERE day >= ? AND day < ?"
        f" UNION SELECT turn_id FROM usage WHERE {later} AND {within}{team})"
        f" SELECT {fields} FROM usage WHERE id IN (SELECT turn_id || ':1' FROM c)"
        f" AND created_at >= ? AND created_at < ?{team}"
        f" UNION ALL SELECT {fields} FROM usage WHERE {later}"
        f" AND turn_id IN (SELECT turn_id FROM c) AND created_at >= ? AND created_at < ?{team}",
        *days,
        *bounds,
        *teams,
        *span,
        *teams,
        *span,
        *teams,
    )
    turns: dict[str, list[Row]] = {}
    for row in rows:
        turns.setdefault(row[1], []).append(row)
    for attempts in turns.values():
        by_day: dict[int, list[Row]] = {}
        for row in attempts:
            by_day.setdefault(math.floor(row[3] / USAGE_DAY) * USAGE_DAY, []).append(row)
        if len(by_day) < 2:
            continue
        _count_turn(by_key, attempts, 1, bucket)
        for some in by_day.values():
            _count_turn(by_key, some, -1, bucket)


def _count_turn(by_key: Index, attempts: list[Row], sign: int, bucket: int) -> None:
    """Count a turn of these attempts (rows of `_FIELDS`) at its last, `sign` times."""
    last = max(attempts, key=lambda row: (len(row[0]), row[0]))
    _, _, _, at, group, status, _, _, _, _ = last
    record = by_key[math.floor(at / bucket) * bucket][group]
    record["requests"] += sign
    record["interrupted"] += sign * (status == "interrupted")
    record["errors"] += sign * (status == "error")
    record["estimated"] += sign * any(
        row[6] != "provider" and row[8] + row[9] > 0 for row in attempts
    )
    record["unpriced_requests"] += sign * any(row[7] is None for row in attempts)


# The CSV's columns: the report's, with who each group is by name (`group_name`; a key's or
# team's) and the team it belongs to (a key's team, or the team the report is of; empty for a
# report of every team grouped by something teams share), after the group.
CSV_COLUMNS = [*COLUMNS[:2], "group_name", "team_id", "team_name", *COLUMNS[2:]]
# What the CSV's last row adds up; a rate is left to the spreadsheet.
_TOTALLED = [name for name in COLUMNS if name not in ("period_start", "group")]
Name = tuple[str | None, str | None, str | None]  # a group's name, its team's id and name
Names = dict[Any, Name]


def to_csv(
    rows: list[dict[str, Any]],
    names: Names | None = None,
    every: Name = (None, None, None),
    teams: dict[str, str] | None = None,
) -> str:
    """The rows as CSV, each with its group's name and team (`names`, by group; `every`
    for a group not there, and the totals; a row's own `team_id` named from `teams`), then
    a row `total` of every count and the cost; every text cell a spreadsheet would run as a
    formula (`=`, `+`, `-`, `@`, a tab or a carriage return first: a key's name, a user)
    made inert with a `'` first, as OWASP advises."""
    names = names or {}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in rows:
        group_name, team_id, team_name = names.get(row["group"], every)
        if "team_id" in row:  # a report split by team (`report_by_team`)
            team_id = row["team_id"]
            team_name = (teams or {}).get(team_id) if team_id is not None else None
        named = row | {"group_name": group_name, "team_id": team_id, "team_name": team_name}
        writer.writerow({k: inert(v) for k, v in named.items()})
    total: dict[str, Any] = {name: sum(row[name] or 0 for row in rows) for name in _TOTALLED}
    costs = [row["cost_usd"] for row in rows if row["cost_usd"] is not None]
    total["cost_usd"] = round(sum(costs), 10) if costs else None
    writer.writerow({"period_start": "total", "team_id": every[1], "team_name": every[2], **total})
    return buffer.getvalue()


def inert(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as it is: a `'` before text it would run as a formula."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def parse_time(value: str | None, default: float) -> float:
    """Unix seconds, or an ISO 8601 date or time (UTC when no zone is given)."""
    if value is None or value == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # nan and inf parse as floats, and were echoed into the JSON answer as bare NaN and
        # Infinity, which is not JSON: a 400 instead.
        if not math.isfinite(seconds):
            raise ValueError(f"not a finite time: {value!r}")
        return seconds
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
