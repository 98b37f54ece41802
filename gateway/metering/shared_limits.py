"""Limits shared by the workers of `gateway serve --workers N` without Redis.

Each worker is a process of its own, so in-process counters would let each spend a whole budget
(N times it across N workers). Instead the supervisor runs one `Limiter`, the in-process one,
behind a Unix socket (`LimitServer`, in a thread of its own), and every worker admits through it
(`SharedLimiter`): the same windows, counters, reservations and spend as one process would keep,
for all the workers of the host. With `limits.redis_url` set, Redis is shared instead (and by
every host), and this is not started.

The protocol is newline-delimited JSON, one message a line, each way:

- `admit` (worker -> supervisor): the scopes with their limits, the tokens and cost to reserve.
  The answer, `admitted`, carries each scope's state as the request found it and a lease id when
  every limit let it in; the worker renders headers, the 429 and the metrics from the states
  with `check_scope`, as `RedisLimiter` does with its script's answer.
- `settle` (worker -> supervisor): a lease's real cost and tokens. No answer.
- `spend` (supervisor -> worker): a budget's spend so far, read by the worker from the store
  (the supervisor has no store of its own), answered by `spent`. Asked once a period per scope.

Costs: one round trip over the socket per admission of a request that has limits (a request
without limits is admitted in the worker, as before), and one message per settle, written
without waiting. A worker that dies has its leases released when its connection closes (as a
Redis lease lapses): their reservations and slots free at once; what those requests had spent
reaches the budget when its spend is next read from the store.

The supervisor unreachable (it died, or a restarted worker's connection failed): the worker
falls back to its own in-process limits, says so once in the log, counts each such admission in
`gateway_limit_shared_fallbacks_total`, and tries the socket again every second. Refusing all
traffic would be worse than each worker enforcing the limits alone for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import Counter

from gateway import metrics
from gateway.errors import LimitExceeded
from gateway.metering.limits import (
    BudgetWatch,
    Lease,
    Limiter,
    Limits,
    ScopeState,
    SpendLoader,
    check_scope,
)

log = logging.getLogger(__name__)

SOCKET_ENV = "GATEWAY_LIMITS_SOCKET"  # set by the supervisor for its workers

SHARED_FALLBACKS = Counter(
    "gateway_limit_shared_fallbacks_total",
    "Admissions a worker of `serve --workers N` checked against its own limits because the"
    " supervisor's shared limiter was unreachable.",
    registry=metrics.REGISTRY,
)

_LINE_LIMIT = 1 << 20
_RETRY_S = 1.0
# An admission the supervisor has not answered within this is decided by the worker alone.
_ANSWER_S = 10.0


def _line(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


def _scopes(raw: list[Any], cache: dict[bytes, Limits]) -> list[tuple[str, str, Limits]]:
    out = []
    for kind, ident, limits in raw:
        key = orjson.dumps(limits, option=orjson.OPT_SORT_KEYS)
        parsed = cache.get(key)
        if parsed is None:
            if len(cache) > 10_000:
                cache.clear()
            parsed = cache[key] = Limits.model_validate(limits)
        out.append((str(kind), str(ident), parsed))
    return out


@functools.lru_cache(maxsize=4096)
def _dumped(limits: Limits) -> dict[str, Any]:
    """A scope's limits as sent (frozen, so one dump serves every request of the scope)."""
    return limits.model_dump(exclude_none=True)


# -- the supervisor's side ------------------------------------------------------------------------


class _Connection:
    """One worker's connection: its open leases, and the spend reads asked of it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.leases: dict[int, Lease] = {}
        self.asked: dict[int, asyncio.Future[float]] = {}
        self.next_ask = 0

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(_line(message))


# Which connection an admission came from: its spend loader asks that worker.
_ASKER: contextvars.ContextVar[_Connection] = contextvars.ContextVar("asker")


class LimitServer:
    """The shared `Limiter`, served on a Unix socket (what the supervisor runs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.limiter = Limiter(self._spend)
        self._next_lease = 0
        self._limits: dict[bytes, Limits] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=_LINE_LIMIT)
        os.chmod(self.path, 0o600)  # only this user's processes may admit through it

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for connection in list(self._connections):
            connection.writer.close()

    async def _spend(self, kind: str, ident: str, since: float) -> float:
        connection = _ASKER.get()
        ask = connection.next_ask = connection.next_ask + 1
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        connection.asked[ask] = future
        connection.send({"op": "spend", "id": ask, "kind": kind, "ident": ident, "since": since})
        try:
            return await future
        finally:
            connection.asked.pop(ask, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer)
        self._connections.add(connection)
        _ASKER.set(connection)
        try:
            while line := await reader.readline():
                message = orjson.loads(line)
                op = message.get("op")
                if op == "admit":
                    # In a task: deciding may wait for a spend read that this worker answers
                    # on this same connection.
                    task = asyncio.create_task(self._admit(connection, message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif op == "settle":
                    lease = connection.leases.pop(int(message["lease"]), None)
                    if lease is not None:
                        lease.settle(message.get("cost"), message.get("tokens"))
                elif op == "spent":
                    future = connection.asked.get(int(message["id"]))
                    if future is not None and not future.done():
                        if "error" in message:
                            future.set_exception(RuntimeError(str(message["error"])))
                        else:
                            future.set_result(float(message["value"]))
        except (ConnectionError, asyncio.IncompleteReadError, orjson.JSONDecodeError) as exc:
            log.warning("a worker's connection to the shared limiter broke: %r", exc)
        finally:
            self._connections.discard(connection)
            # A worker gone: its leases free their slots and reservations now (their spend is
            # in that worker's usage records), and the spend it was asked for never comes.
            for lease in connection.leases.values():
                lease.release()
            connection.leases.clear()
            for future in connection.asked.values():
                if not future.done():
                    future.set_exception(ConnectionError("the worker went away"))
            writer.close()

    async def _admit(self, connection: _Connection, message: dict[str, Any]) -> None:
        ident = message["id"]
        try:
            scopes = _scopes(message["scopes"], self._limits)
            lease, states = await self.limiter.decide(
                scopes, int(message["tokens"]), float(message["cost"])
            )
        except Exception as exc:  # a spend read that failed: the worker decides alone
            connection.send({"op": "admitted", "id": ident, "error": repr(exc)})
            return
        answer: dict[str, Any] = {
            "op": "admitted",
            "id": ident,
            "states": [
                [
                    s.requests,
                    s.requests_reset,
                    s.tokens,
                    s.tokens_reset,
                    s.in_flight,
                    s.spent,
                    s.reserved,
                ]
                for s in states
            ],
        }
        if lease is not None:
            if connection.writer.is_closing():
                lease.release()
                return
            self._next_lease += 1
            connection.leases[self._next_lease] = lease
            answer["lease"] = self._next_lease
        connection.send(answer)


def serve_in_thread(path: str) -> threading.Thread:
    """Start a `LimitServer` on `path` in a daemon thread of its own event loop; returns once
    it listens (or raises what stopped it)."""
    ready: list[BaseException | None] = []
    started = threading.Event()

    async def run() -> None:
        server = LimitServer(path)
        try:
            await server.start()
        except BaseException as exc:
            ready.append(exc)
            started.set()
            raise
        ready.append(None)
        started.set()
        await asyncio.Event().wait()  # as long as the supervisor lives

    def main() -> None:
        with contextlib.suppress(BaseException):
            try:
                import uvloop  # as the workers run: a round trip costs less
            except ImportError:  # pragma: no cover - platforms without uvloop
                asyncio.run(run())
            else:
                uvloop.run(run())

    thread = threading.Thread(target=main, name="shared-limits", daemon=True)
    thread.start()
    started.wait()
    if ready and ready[0] is not None:
        raise ready[0]
    return thread


# -- a worker's side ------------------------------------------------------------------------------


@dataclass
class SharedLease(Lease):
    """A lease held in the supervisor's limiter: `id` names it there."""

    id: int = 0


class SharedLimiter(Limiter):
    """A worker's limits: the supervisor's, through its socket; its own while that is down."""

    def __init__(self, path: str, spend: SpendLoader, watch: BudgetWatch | None = None) -> None:
        super().__init__(spend, watch)  # the in-process state serves while it is away
        self.path = path
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connecting: asyncio.Future[bool] | None = None
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0
        self._down_since: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def admit(self, scopes: list[tuple[str, str, Limits]], tokens: int, cost: float) -> Lease:
        writer = self._writer if scopes and await self._connected() else None
        if writer is None or writer.is_closing():
            if scopes:
                SHARED_FALLBACKS.inc()
            return await super().admit(scopes, tokens, cost)
        self._next += 1
        ident = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        # Registered while the connection is open: if it breaks, its reader fails the future.
        self._waiting[ident] = future
        message = {
            "op": "admit",
            "id": ident,
            "scopes": [[kind, scope, _dumped(limits)] for kind, scope, limits in scopes],
            "tokens": tokens,
            "cost": cost,
        }
        try:
            writer.write(_line(message))
            async with asyncio.timeout(_ANSWER_S):
                answer = await future
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            self._lost(exc)
            SHARED_FALLBACKS.inc()
            return await super().admit(scopes, tokens, cost)
        finally:
            self._waiting.pop(ident, None)
        if "error" in answer:
            log.warning("the shared limiter could not decide (%s): decided here", answer["error"])
            SHARED_FALLBACKS.inc()
            return await super().admit(scopes, tokens, cost)
        return self._decided(scopes, tokens, cost, answer)

    def _decided(
        self,
        scopes: list[tuple[str, str, Limits]],
        tokens: int,
        cost: float,
        answer: dict[str, Any],
    ) -> Lease:
        lease_id = answer.get("lease")
        lease = SharedLease(self, scopes, tokens, cost, id=int(lease_id or 0))
        states = [
            ScopeState(int(v[0]), float(v[1]), int(v[2]), float(v[3]), int(v[4]), v[5], v[6])
            for v in answer["states"]
        ]
        try:
            for (kind, ident, limits), state in zip(scopes, states, strict=True):
                check_scope(kind, limits, tokens, cost, state, lease.headers, ident, self.watch)
        except LimitExceeded:
            if lease_id is not None:  # both compare the same numbers: never
                lease.release()
            raise
        if lease_id is None:
            raise LimitExceeded("Rate limit reached.")  # as above: never
        return lease

    def _settle(self, lease: Lease, cost: float | None, tokens: int | None) -> None:
        if not isinstance(lease, SharedLease):
            super()._settle(lease, cost, tokens)  # admitted here while the supervisor was away
            return
        writer = self._writer
        if writer is None or writer.is_closing():
            return  # the connection closed: the supervisor released the lease then
        writer.write(_line({"op": "settle", "lease": lease.id, "cost": cost, "tokens": tokens}))

    async def _connected(self) -> bool:
        if self._writer is not None and not self._writer.is_closing():
            return True
        if self._closed:
            return False
        if self._down_since is not None and time.monotonic() - self._down_since < _RETRY_S:
            return False
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _connect(self) -> bool:
        try:
            reader, writer = await asyncio.open_unix_connection(self.path, limit=_LINE_LIMIT)
        except OSError as exc:
            self._lost(exc)
            return False
        self._writer = writer
        self._reading = asyncio.get_running_loop().create_task(self._read(reader, writer))
        if self._down_since is not None:
            log.warning("the shared limiter answers again: limits are shared by every worker")
        self._down_since = None
        return True

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: BaseException = ConnectionError("the shared limiter closed the connection")
        try:
            while line := await reader.readline():
                message = orjson.loads(line)
                if message.get("op") == "spend":
                    task = asyncio.create_task(self._answer_spend(writer, message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    continue
                future = self._waiting.get(int(message.get("id", 0)))
                if future is not None and not future.done():
                    future.set_result(message)
                elif message.get("lease") is not None:  # answered after its request gave up
                    release = {"op": "settle", "lease": message["lease"], "cost": 0, "tokens": 0}
                    writer.write(_line(release))
        except (ConnectionError, asyncio.IncompleteReadError, orjson.JSONDecodeError) as exc:
            error = exc
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError(str(error)))
            if not self._closed:
                self._lost(error)

    async def _answer_spend(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        try:
            value = await self._spend(message["kind"], message["ident"], message["since"])
            answer: dict[str, Any] = {"op": "spent", "id": message["id"], "value": value}
        except Exception as exc:
            answer = {"op": "spent", "id": message["id"], "error": repr(exc)}
        if not writer.is_closing():
            writer.write(_line(answer))

    def _lost(self, error: BaseException) -> None:
        if self._down_since is None:
            log.warning(
                "the shared limiter (%s) is unreachable (%r): this worker checks rate limits"
                " and budgets against its own counts until it answers again",
                self.path,
                error,
            )
            # What this worker knew of budget spend is stale: read it again from the store.
            for scope in self._scopes.values():
                scope.budget_period = None
        self._down_since = time.monotonic()

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        tasks = [t for t in (self._reading, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
