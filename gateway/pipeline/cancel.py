"""One cancel behind its three doors: a chat completion by its request id, a response by its
id, a conversation's turn by its id (gateway.http.chat, .responses, .conversations).

A turn stops where it runs. In this process, its relay ends the answer after the last frame its
client got, and the turn records exactly that. On another replica (replicas sharing Redis), the
cancel is passed on through Redis to the one running it (gateway.pipeline.cancel_bus), and is
done once the store shows the turn ended; without Redis, or when no replica ends it, the turn is
taken for not running. Each door says the outcome in its own API's words.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.context import Gateway, InFlight
from gateway.conversations.truncate import truncate, truncate_cancelled
from gateway.errors import GatewayError
from gateway.metering.keys import Principal

if TYPE_CHECKING:  # redis-py is slow to import; loaded only with `limits.redis_url`
    from gateway.pipeline.cancel_bus import CancelBus

# Set when replicas share Redis: a cancel of a turn another replica runs goes through it.
CANCEL_BUS: web.AppKey[CancelBus] = web.AppKey("cancel_bus")

# How long a cancel waits for its turn to end: a cancelled stream ends once its last frames are
# acknowledged by the client, or after a short grace when they are not.
END_WAIT_S = 10.0
# A turn another replica runs: its end is read from the store, which it reaches a commit later.
REMOTE_END_WAIT_S = 5.0
_REMOTE_POLL_S = 0.05


class Outcome(enum.Enum):
    CANCELLED = "cancelled"  # stopped (and, when waited for, ended)
    FINISHING = "finishing"  # running here, but already past the point a cancel can stop
    ENDED = "ended"  # the store has it ended already
    NOT_ENDED = "not_ended"  # stopped here, but its end did not come within END_WAIT_S
    NOT_RUNNING = "not_running"  # no such open turn, or no replica ended it


@dataclass(frozen=True, slots=True)
class Cancel:
    outcome: Outcome
    turn_id: str | None = None
    conversation_id: str | None = None
    status: str | None = None  # the turn's end as recorded, once it has ended


async def stop(
    gateway: Gateway,
    bus: CancelBus | None,
    principal: Principal,
    *,
    here: InFlight | None,
    turn_id: str | None,
    conversation_id: str | None = None,
    wait: bool = True,
) -> Cancel:
    """Stop a turn: `here`, the one this process runs (found by the door's own id), else the
    stored turn `turn_id` (of `conversation_id`, when the door names one), which the principal
    may see. `wait`: answer once the turn has ended, with its recorded status (a cancel on
    another replica always waits: only the store tells that it took effect)."""
    if here is not None:
        return await _here(gateway, here, wait)
    if turn_id is None:
        return Cancel(Outcome.NOT_RUNNING)
    state = await gateway.store.turn_state(turn_id)
    if (
        state is None
        or not principal.sees(state.team_id)
        or (conversation_id is not None and state.conversation_id != conversation_id)
    ):
        return Cancel(Outcome.NOT_RUNNING, turn_id)
    if state.ended_at is not None:
        return Cancel(Outcome.ENDED, turn_id, state.conversation_id, state.status)
    if bus is None or not await bus.publish(turn_id):
        return Cancel(Outcome.NOT_RUNNING, turn_id, state.conversation_id)
    try:
        async with asyncio.timeout(REMOTE_END_WAIT_S):
            while state is not None and state.ended_at is None:
                await asyncio.sleep(_REMOTE_POLL_S)
                state = await gateway.store.turn_state(turn_id)
    except TimeoutError:
        # Open in the store, yet no replica ended it: none runs it (its process died and it
        # awaits recovery), or the cancel was lost on the way.
        return Cancel(Outcome.NOT_RUNNING, turn_id)
    status = state.status if state is not None else None
    return Cancel(Outcome.CANCELLED, turn_id, state.conversation_id if state else None, status)


async def _here(gateway: Gateway, entry: InFlight, wait: bool) -> Cancel:
    turn = entry.turn
    if not entry.cancel():
        return Cancel(Outcome.FINISHING, turn.turn_id, turn.conversation_id)
    if not wait:
        return Cancel(Outcome.CANCELLED, turn.turn_id, turn.conversation_id)
    try:
        async with asyncio.timeout(END_WAIT_S):
            await turn.wait_ended()
    except TimeoutError:
        return Cancel(Outcome.NOT_ENDED, turn.turn_id, turn.conversation_id)
    state = await gateway.store.turn_state(turn.turn_id)
    status = state.status if state is not None else None
    return Cancel(Outcome.CANCELLED, turn.turn_id, turn.conversation_id, status)


async def truncated(
    gateway: Gateway,
    here: InFlight | None,
    done: Cancel,
    content_chars: int,
    principal: Principal,
) -> dict[str, Any]:
    """Once a cancel took effect: the turn's interrupted answer truncated to the `content_chars`
    its client showed (docs/recording.md, "What the user saw"), as the truncate API answers."""
    if here is not None:  # waits for the turn's end
        return await truncate_cancelled(gateway.conversations, here.turn, content_chars, principal)
    assert done.conversation_id is not None and done.turn_id is not None  # ended: the store said
    try:
        return await truncate(
            gateway.conversations, done.conversation_id, done.turn_id, content_chars, principal
        )
    except GatewayError as error:
        error.message = f"The request was cancelled, but not truncated: {error.message}"
        raise
