"""Budget notifications: a budget's spend passing a configured share of it, told once a period.

The limiter shows each budget's spend to `BudgetWatch.saw` as an admission finds it (every
limiter: in process, the workers' shared one, Redis), so a threshold is noticed by the first
request after spend passed it; a request a hard budget refuses counts as 100%. Nothing of a
notice happens on the request path: `saw` compares two numbers, and a share not told yet this
period starts a background task, which claims the notice in the store (`budget_notices`: one
replica, one worker, one life of the process tells it), logs it, and POSTs it to the webhook,
signed, retried with backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from gateway.ids import random_hex
from gateway.metering.limits import Budget, period_end, period_start

if TYPE_CHECKING:
    from gateway.config import BudgetAlertsConfig
    from gateway.storage.db import Db
    from gateway.storage.store import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Gateway-Signature"
# Notices remembered in memory before the store alone says which were told.
_SEEN_MAX = 10_000


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: what a receiver recomputes with the shared secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def scope_fields(kind: str, ident: str) -> dict[str, str | None]:
    """Which team, key and end user a scope is (gateway.metering.limits.USER_SCOPES)."""
    owner, _, user = ident.partition(":") if kind.endswith(".user") else (ident, "", "")
    return {
        "team_id": owner if kind.startswith("team") else None,
        "key_id": owner if kind.startswith("key") else None,
        "user": user or None,
    }


class BudgetWatch:
    def __init__(self, config: BudgetAlertsConfig, store: Store | None) -> None:
        self.thresholds = tuple(config.thresholds)
        self._lowest = self.thresholds[0] if self.thresholds else float("inf")
        self._url = config.webhook_url
        self._secret = config.webhook_secret or ""
        self._store = store
        self._seen: set[tuple[str, str, float, float]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.attempts = 5
        self.backoff_s = 1.0  # doubled after each failed attempt

    def saw(self, kind: str, ident: str, budget: Budget, spent: float, refused: bool) -> None:
        share = max(spent / budget.usd, 1.0 if refused else 0.0)
        if share < self._lowest:
            return
        now = time.time()
        start = period_start(budget.period, now)
        for threshold in self.thresholds:
            if threshold > share:
                break
            seen = (kind, ident, start, threshold)
            if seen in self._seen:
                continue
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen.add(seen)
            notice = {
                "id": "bnotice_" + random_hex(16),  # a receiver's key against retried deliveries
                "type": "budget.threshold",
                "threshold": threshold,
                "scope": kind,
                **scope_fields(kind, ident),
                "budget_usd": budget.usd,
                "period": budget.period,
                "mode": budget.mode,
                "period_start": _iso(start) if budget.period != "total" else None,
                "period_end": _iso(period_end(budget.period, now)),
                "spent_usd": round(spent, 6),
                # Reached by a refusal rather than by spend: a hard budget's 100%.
                "refused": refused and spent < threshold * budget.usd,
                "at": _iso(now),
            }
            task = asyncio.get_running_loop().create_task(self._tell(ident, start, notice))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _tell(self, ident: str, start: float, notice: dict[str, Any]) -> None:
        if not await self._claim(notice["scope"], ident, start, notice["threshold"]):
            return
        log.warning(
            "budget notice: the %s %s budget of %g USD per %s has reached %g%% (%.6f USD spent%s)",
            notice["scope"],
            ident,
            notice["budget_usd"],
            notice["period"],
            notice["threshold"] * 100,
            notice["spent_usd"],
            "; a request was refused" if notice["refused"] else "",
        )
        if self._url is not None:
            await self._post(self._url, orjson.dumps(notice))

    async def _claim(self, kind: str, ident: str, start: float, threshold: float) -> bool:
        """Whether this process tells the notice: the first to record it in the store. A store
        that cannot be reached lets it tell: a notice twice rather than never."""
        if self._store is None:
            return True

        async def claim(db: Db) -> bool:
            inserted = await db.execute(
                "INSERT INTO budget_notices (kind, ident, period_start, threshold, notified_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                kind,
                ident,
                start,
                threshold,
                time.time(),
            )
            return inserted > 0

        try:
            return await self._store.run(claim)
        except Exception as error:  # the store's failure must not lose the notice
            log.warning("budget notice: could not record it in the store (%r): told anyway", error)
            return True

    async def _post(self, url: str, body: bytes) -> None:
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(self._secret, body)}
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        wait = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                async with self._session.post(url, data=body, headers=headers) as answer:
                    if answer.status < 300:
                        return
                    problem = f"HTTP {answer.status}"
            except (aiohttp.ClientError, TimeoutError) as error:
                problem = repr(error)
            if attempt == self.attempts:
                log.error("budget notice: the webhook failed %d times (%s)", attempt, problem)
                return
            log.warning("budget notice: the webhook failed (%s); retrying", problem)
            await asyncio.sleep(wait)
            wait *= 2

    async def close(self, grace_s: float = 5.0) -> None:
        """Let the notices under way finish for a while, then stop them."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
