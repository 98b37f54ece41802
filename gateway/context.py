"""The per-app state handlers reach through `request.app[GATEWAY]`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.service import Conversations
from gateway.conversations.turn_ends import TurnEnds
from gateway.dialects.base import Dialect
from gateway.lanes import KeyLanes
from gateway.metering.auth import Authenticator
from gateway.metering.key_store import KeyStore
from gateway.metering.keys import Principal
from gateway.metering.limits import Limiter
from gateway.metering.reports import UsageStore
from gateway.metering.usage import Meter
from gateway.routing.router import Router
from gateway.storage.records import ContentBlock
from gateway.storage.store import Store
from gateway.upstream.pool import UpstreamPool


class InFlight(Protocol):
    """A turn in progress that an explicit cancel can stop (gateway.pipeline.relay.Relay)."""

    turn: TurnRecorder

    def cancel(self) -> bool:
        """Stop it; False when it is already finishing."""
        ...

    def shown(self) -> list[ContentBlock] | None:
        """The answer's blocks as its client has them now; None for a whole answer."""
        ...

    def shut_down(self, now: bool = False) -> None:
        """The gateway is stopping and its grace is over: end the answer with the client's
        shutdown event, its turn recorded with reason `shutdown`; `now`: cancel it wherever
        it waits (on a client that stopped reading), recording the same way."""
        ...


class InFlightTable(MutableMapping[tuple[str | None, str], InFlight]):
    """In-flight turns by (team, request or response id), and by turn id.

    The relay registers itself with `setdefault` and leaves with `pop`; every change here also
    keeps the index by turn id, so that a cancel naming a turn finds it without a scan of
    every request in flight."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str | None, str], InFlight] = {}
        self.by_turn: dict[str, InFlight] = {}

    def __getitem__(self, key: tuple[str | None, str]) -> InFlight:
        return self._entries[key]

    def __setitem__(self, key: tuple[str | None, str], entry: InFlight) -> None:
        replaced = self._entries.get(key)
        if replaced is not None:
            self.by_turn.pop(replaced.turn.turn_id, None)
        self._entries[key] = entry
        self.by_turn[entry.turn.turn_id] = entry

    def __delitem__(self, key: tuple[str | None, str]) -> None:
        entry = self._entries.pop(key)
        if self.by_turn.get(entry.turn.turn_id) is entry:
            del self.by_turn[entry.turn.turn_id]

    def __iter__(self) -> Iterator[tuple[str | None, str]]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def setdefault(self, key: tuple[str | None, str], default: InFlight) -> InFlight:
        # Once per request: without the KeyError the inherited one raises for a new key.
        found = self._entries.get(key)
        if found is None:
            self[key] = found = default
        return found


@dataclass
class Gateway:
    """Everything a handler needs, built once per app."""

    config: GatewayConfig
    store: Store
    conversations: Conversations
    keys: KeyStore
    auth: Authenticator
    usage: UsageStore
    limiter: Limiter
    meter: Meter | None = None
    router: Router | None = None
    upstreams: UpstreamPool | None = None  # keep-alive connections to every upstream
    state: dict[str, bool] = field(default_factory=lambda: {"shutting_down": False})
    # Work that outlives its request (draining an upstream); awaited at shutdown.
    background: set[asyncio.Task[None]] = field(default_factory=set)
    # In-flight completions for POST .../cancel, by (team, request or response id): a client
    # chooses its request ids, so each team has its own (one team's never blocks another's).
    cancels: InFlightTable = field(default_factory=InFlightTable)
    # Non-streaming answers complete here, recorded a loop iteration's worth at a time.
    turn_ends: TurnEnds = field(default_factory=TurnEnds)
    # Every turn being relayed, for the shutdown deadline to end (gateway.cli, `_serve`).
    running: set[InFlight] = field(default_factory=set)
    # Each key's large request bodies, a few at a time (gateway.http.large_bodies).
    body_lanes: KeyLanes = field(default_factory=KeyLanes)
    # Each key's conversation searches, one at a time (gateway.http.conversations_list).
    search_lanes: KeyLanes = field(default_factory=KeyLanes)

    def in_flight(self, key: str, principal: Principal) -> InFlight | None:
        """The in-flight turn a cancel names: the principal's team's; the admin's, any team's."""
        found = self.cancels.get((principal.team_id, key))
        if found is None and principal.is_admin:
            found = next((f for (_, k), f in self.cancels.items() if k == key), None)
        return found

    def in_flight_turn(self, turn_id: str, principal: Principal) -> InFlight | None:
        """The in-flight turn with this id, if it runs in this process and the principal's
        team may see it (the admin sees every team's)."""
        found = self.cancels.by_turn.get(turn_id)
        if found is None or not principal.sees(found.turn.team_id):
            return None
        return found

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    @property
    def routes(self) -> Router:
        assert self.router is not None, "the app has not started"
        return self.router

    def cancel_reason(self) -> str:
        return "shutdown" if self.state["shutting_down"] else "client_disconnect"


GATEWAY = web.AppKey("gateway", Gateway)
# The routes whose clients speak another API than OpenAI's, by that API's dialect: their errors,
# the middleware's and the handlers', come in its shape (gateway.http.middleware).
ERROR_DIALECTS: web.AppKey[dict[web.AbstractRoute, Dialect]] = web.AppKey("error_dialects")
