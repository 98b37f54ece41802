"""Rate limits and budgets, per key and per team, checked before any upstream call.

- Requests per minute and tokens per minute: sliding one-minute windows. Tokens are taken at
  admission as an estimate (prompt + `max_tokens`) and corrected to the real count at the end.
- Concurrent requests: a counter held for the request's life.
- Budgets in USD per day, week, month or in total: `hard` refuses (429 `budget_exceeded`, with
  `Retry-After` until the period ends and `x-should-retry: false`: no client retry can succeed
  sooner), `soft` lets the request through with a warning header. Each admitted request
  reserves its estimated cost until its real cost is known, so concurrent requests cannot
  overshoot a hard budget by more than what is reserved in flight; spend so far is read once
  from the usage records.
- The same limits per end user under a key or team (`end_user`): each end user of it is a scope
  of its own (`key.user`, `team.user`), admitted by the same rules.

This is the in-process implementation: one replica's view. With `limits.redis_url` set,
`gateway.metering.redis_limits.RedisLimiter` keeps the same windows in Redis for every replica;
both build their headers and errors with `check_scope`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from gateway import metrics
from gateway.errors import BudgetExceeded, LimitExceeded

if TYPE_CHECKING:
    from gateway.metering.request_tokens import PromptExtras

WINDOW_S = 60.0


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    usd: float = Field(gt=0, description="The budget in USD.")
    period: Literal["day", "week", "month", "total"] = "month"
    mode: Literal["hard", "soft"] = "hard"


class EndUserLimits(BaseModel):
    """The limits of one scope: a key's, a team's, or each end user's under one of them."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    rpm: int | None = Field(None, ge=1, description="Requests per minute.")
    tpm: int | None = Field(None, ge=1, description="Tokens per minute (prompt + completion).")
    max_concurrent: int | None = Field(None, ge=1, description="Requests in flight at once.")
    budget: Budget | None = None


class Limits(EndUserLimits):
    end_user: EndUserLimits | None = Field(
        None,
        description="The same limits again for each end user of the key or team (the"
        " request's `user`, else the configured `limits.end_user_header`), each on its own.",
    )


# An end user's scope under its key or team: the kind, and its ident's owner and user joined by
# ":" (which no key or team id holds).
USER_SCOPES = {"key": "key.user", "team": "team.user"}


def period_start(period: str, now: float) -> float:
    moment = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    elif period == "week":
        start = (moment - timedelta(days=moment.weekday())).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
    elif period == "month":
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        return 0.0
    return start.timestamp()


class BudgetWatch(Protocol):
    """What is told each budget's spend as an admission finds it (gateway.metering.budget_alerts
    notifies its thresholds)."""

    def saw(self, kind: str, ident: str, budget: Budget, spent: float, refused: bool) -> None: ...

    async def close(self) -> None: ...


def period_end(period: str, now: float) -> float | None:
    """When the budget period holding `now` ends (None: a `total` budget never renews)."""
    if period == "total":
        return None
    start = datetime.fromtimestamp(period_start(period, now), UTC)
    if period == "day":
        return (start + timedelta(days=1)).timestamp()
    if period == "week":
        return (start + timedelta(days=7)).timestamp()
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month).timestamp()


@dataclass(frozen=True)
class ScopeState:
    """One scope as an admission finds it, before the request is counted: the in-process
    `Limiter` reads it from memory, `RedisLimiter` from its admission script."""

    requests: int  # admitted in the last minute
    requests_reset: float  # seconds until the oldest of them leaves the window
    tokens: int  # taken in the last minute
    tokens_reset: float  # seconds until enough tokens leave the window for this request
    in_flight: int
    spent: float  # USD in the budget's current period
    reserved: float  # USD reserved by requests in flight


def check_scope(
    kind: str,
    limits: Limits,
    tokens: int,
    cost: float,
    state: ScopeState,
    headers: dict[str, str],
    ident: str = "",
    watch: BudgetWatch | None = None,
) -> None:
    """Add the scope's x-ratelimit-* headers; raise the 429 if a limit is reached (a soft budget
    only warns). `watch` sees each budget's spend, for its notifications."""
    if limits.rpm is not None:
        remaining = limits.rpm - state.requests
        reset = state.requests_reset
        headers.setdefault("x-ratelimit-limit-requests", str(limits.rpm))
        headers.setdefault("x-ratelimit-remaining-requests", str(max(0, remaining - 1)))
        headers.setdefault("x-ratelimit-reset-requests", f"{reset:.3f}s")
        if remaining <= 0:
            _refuse("rpm", kind, f"{limits.rpm} requests per minute", reset, headers)
    if limits.tpm is not None:
        remaining = limits.tpm - state.tokens
        reset = state.tokens_reset
        headers.setdefault("x-ratelimit-limit-tokens", str(limits.tpm))
        headers.setdefault("x-ratelimit-remaining-tokens", str(max(0, remaining - tokens)))
        headers.setdefault("x-ratelimit-reset-tokens", f"{reset:.3f}s")
        if tokens > remaining:
            _refuse("tpm", kind, f"{limits.tpm} tokens per minute", reset, headers)
    if limits.max_concurrent is not None and state.in_flight >= limits.max_concurrent:
        _refuse("concurrency", kind, f"{limits.max_concurrent} concurrent requests", 1.0, headers)
    budget = limits.budget
    if budget is None:
        return
    over = state.spent + state.reserved + cost > budget.usd
    if watch is not None:
        watch.saw(kind, ident, budget, state.spent, over and budget.mode == "hard")
    if over:
        detail = (
            f"the {kind} budget of {budget.usd:g} USD per {budget.period} is spent"
            f" ({state.spent:.6f} USD used, {state.reserved:.6f} USD reserved by requests"
            f" in flight; this request reserves {cost:.6f} USD, the most it may cost: a"
            " lower max_tokens reserves less)"
        )
        if budget.mode == "soft":
            headers["X-Gateway-Budget-Warning"] = detail
            metrics.BUDGET_WARNINGS.labels(kind).inc()
        else:
            metrics.LIMIT_REJECTIONS.labels("budget", kind).inc()
            error = BudgetExceeded(f"Budget exceeded: {detail}.")
            error.headers.update(headers)
            # Retrying cannot help before the period renews: the SDKs obey x-should-retry
            # before their own rules, which would retry a 429.
            error.headers["x-should-retry"] = "false"
            now = time.time()
            end = period_end(budget.period, now)
            if end is not None:
                error.headers["Retry-After"] = str(max(1, int(end - now + 0.999)))
            raise error


def refuses(limits: Limits, tokens: int, cost: float, state: ScopeState) -> bool:
    """Whether `check_scope` would refuse: the verdict alone, without headers or metrics."""
    if limits.rpm is not None and state.requests >= limits.rpm:
        return True
    if limits.tpm is not None and tokens > limits.tpm - state.tokens:
        return True
    if limits.max_concurrent is not None and state.in_flight >= limits.max_concurrent:
        return True
    budget = limits.budget
    return (
        budget is not None
        and budget.mode == "hard"
        and state.spent + state.reserved + cost > budget.usd
    )


def _failed(future: asyncio.Future[float]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


def _refuse(limit: str, kind: str, what: str, reset: float, headers: dict[str, str]) -> None:
    metrics.LIMIT_REJECTIONS.labels(limit, kind).inc()
    error = LimitExceeded(f"Rate limit reached for this {kind}: {what}. Retry after {reset:.1f}s.")
    error.headers.update(headers)
    error.headers["Retry-After"] = str(max(1, int(reset + 0.999)))
    raise error


@dataclass
class _Scope:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_sum: int = 0
    in_flight: int = 0
    budget_period: float | None = None
    spent: float = 0.0
    reserved: float = 0.0
    loading: tuple[float, asyncio.Future[float]] | None = None

    def prune(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - WINDOW_S:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.token_sum -= self.tokens.popleft()[1]


# (scope kind, scope id, the since time) -> USD spent since then, from the usage records.
SpendLoader = Callable[[str, str, float], Awaitable[float]]


@dataclass
class Lease:
    """What one admitted request holds until it ends."""

    limiter: Limiter
    scopes: list[tuple[str, str, Limits]]
    tokens: int
    cost: float
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = False
    # What the request sends besides its messages (tools, schemas): the meter adds it to an
    # estimate of the prompt when the provider's count never came.
    extras: PromptExtras | None = None

    def settle(self, cost: float | None, tokens: int | None) -> None:
        """The request ended: its real cost and tokens replace the estimates."""
        if self.done:
            return
        self.done = True
        if cost is not None and not cost > 0:  # nothing, negative or NaN: no refund
            cost = 0.0
        self.limiter._settle(self, cost, tokens)

    def release(self) -> None:
        """The request ended before it was metered (refused later, or failed early)."""
        self.settle(0.0, 0)


class Limiter:
    """One process's limits: windows and counters in memory (the default without Redis)."""

    def __init__(self, spend: SpendLoader, watch: BudgetWatch | None = None) -> None:
        self._spend = spend
        self.watch = watch  # budget notifications, told each budget's spend at admission
        self._scopes: dict[tuple[str, str], _Scope] = {}

    def _scope(self, kind: str, ident: str) -> _Scope:
        return self._scopes.setdefault((kind, ident), _Scope())

    async def admit(self, scopes: list[tuple[str, str, Limits]], tokens: int, cost: float) -> Lease:
        now = time.time()
        # Load spend before checking anything: after the awaits, check and reserve happen
        # without yielding, so concurrent requests see each other's reservations.
        await self._load_spend(scopes, now)
        lease = Lease(self, scopes, tokens, cost)
        for kind, ident, limits in scopes:
            self._check(kind, ident, limits, tokens, cost, now, lease.headers)
        self._reserve(scopes, tokens, cost, now)
        return lease

    async def decide(
        self, scopes: list[tuple[str, str, Limits]], tokens: int, cost: float
    ) -> tuple[Lease | None, list[ScopeState]]:
        """An admission decided but not answered: each scope as the request found it, and its
        lease when every limit let it in (it is then counted). The caller renders headers and
        errors from the states with `check_scope`, which reaches the same verdict. What the
        limiter `gateway serve --workers N` shares runs (gateway.metering.shared_limits)."""
        now = time.time()
        await self._load_spend(scopes, now)
        states = [self._state(kind, ident, limits, tokens, now) for kind, ident, limits in scopes]
        for (_, _, limits), state in zip(scopes, states, strict=True):
            if refuses(limits, tokens, cost, state):
                return None, states
        self._reserve(scopes, tokens, cost, now)
        return Lease(self, scopes, tokens, cost), states

    async def _load_spend(self, scopes: list[tuple[str, str, Limits]], now: float) -> None:
        for kind, ident, limits in scopes:
            if limits.budget is not None:
                scope = self._scope(kind, ident)
                start = period_start(limits.budget.period, now)
                if scope.budget_period != start:
                    # One read for all the requests that arrive while it is under way: a
                    # later result must not overwrite spend that has been settled since. A
                    # read that failed is tried again by the next request.
                    loading = scope.loading
                    if loading is None or loading[0] != start or _failed(loading[1]):
                        task = asyncio.ensure_future(self._spend(kind, ident, start))
                        scope.loading = loading = (start, task)
                    spent = await loading[1]
                    if scope.budget_period != start:
                        scope.spent, scope.budget_period = spent, start

    def _reserve(
        self, scopes: list[tuple[str, str, Limits]], tokens: int, cost: float, now: float
    ) -> None:
        for kind, ident, _ in scopes:
            scope = self._scope(kind, ident)
            scope.requests.append(now)
            scope.tokens.append((now, tokens))
            scope.token_sum += tokens
            scope.in_flight += 1
            scope.reserved += cost

    def _check(
        self,
        kind: str,
        ident: str,
        limits: Limits,
        tokens: int,
        cost: float,
        now: float,
        headers: dict[str, str],
    ) -> None:
        state = self._state(kind, ident, limits, tokens, now)
        check_scope(kind, limits, tokens, cost, state, headers, ident, self.watch)

    def _state(self, kind: str, ident: str, limits: Limits, tokens: int, now: float) -> ScopeState:
        scope = self._scope(kind, ident)
        scope.prune(now)
        remaining_tokens = (limits.tpm or 0) - scope.token_sum
        return ScopeState(
            requests=len(scope.requests),
            requests_reset=scope.requests[0] + WINDOW_S - now if scope.requests else 0.0,
            tokens=scope.token_sum,
            tokens_reset=self._tokens_free_in(scope, tokens - remaining_tokens, now)
            if limits.tpm is not None
            else 0.0,
            in_flight=scope.in_flight,
            spent=scope.spent,
            reserved=scope.reserved,
        )

    @staticmethod
    def _tokens_free_in(scope: _Scope, needed: int, now: float) -> float:
        freed = 0
        for t, used in scope.tokens:
            freed += used
            if freed >= needed:
                return max(0.0, t + WINDOW_S - now)
        return WINDOW_S

    def _settle(self, lease: Lease, cost: float | None, tokens: int | None) -> None:
        now = time.time()
        for kind, ident, _ in lease.scopes:
            scope = self._scope(kind, ident)
            scope.in_flight -= 1
            scope.reserved -= lease.cost
            scope.spent += cost or 0.0
            if tokens is not None and tokens != lease.tokens:
                # Correct the estimate taken at admission to the real count.
                scope.tokens.append((now, tokens - lease.tokens))
                scope.token_sum += tokens - lease.tokens

    def held(self, kind: str, ident: str) -> ScopeState:
        """What a scope holds now in this process (for tests, and to compare before/after)."""
        scope = self._scopes.get((kind, ident)) or _Scope()
        scope.prune(time.time())
        return ScopeState(
            requests=len(scope.requests),
            requests_reset=0.0,
            tokens=scope.token_sum,
            tokens_reset=0.0,
            in_flight=scope.in_flight,
            spent=scope.spent,
            reserved=scope.reserved,
        )

    async def close(self) -> None:
        """Nothing to let go in process (`RedisLimiter` waits for its settles here)."""


def scopes_of(
    key_limits: Any,
    team_limits: Any,
    key_id: str | None,
    team_id: str | None,
    user: str | None = None,
) -> list[tuple[str, str, Limits]]:
    """The scopes a request is admitted in: its key's, its team's, and its end user's under
    each of them that sets `end_user` limits."""
    out = []
    if key_id is not None and key_limits:
        out.append(("key", key_id, Limits.model_validate(key_limits)))
    if team_id is not None and team_limits:
        out.append(("team", team_id, Limits.model_validate(team_limits)))
    if user:
        for kind, ident, limits in list(out):
            if limits.end_user is not None:
                # Validated already, as part of its key's or team's limits.
                own = Limits.model_construct(**limits.end_user.__dict__)
                out.append((USER_SCOPES[kind], f"{ident}:{user}", own))
    return out
