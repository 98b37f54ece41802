"""Cancels that reach the replica running the turn, through Redis (`limits.redis_url`).

`POST /v1/conversations/{id}/turns/{turn_id}/cancel` lands on whichever replica the load
balancer picks; the turn runs on one of them. A replica that does not run the turn itself
publishes its id on `{prefix}cancel`; every replica listens there, and the one running it
cancels it exactly as a local cancel would (the turn records what its client received). The
publisher then waits for the turn's end to reach the store, and answers as for a local cancel.

Pub/sub loses what is published while a listener is disconnected, so each cancel is also left
in Redis for a minute (`{prefix}cancel:{turn id}`): a listener that subscribes again looks there
for the turns it runs. A cancel that still reaches no replica in time gets its caller
`turn_not_in_flight`, as for a turn no replica runs. Without Redis a cancel reaches only the
process it lands on.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from gateway.context import Gateway
from gateway.redis_client import ERRORS, REDIS_ERRORS, connect

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # between attempts to listen again after Redis went away
# How long a cancel waits in Redis for a listener that was away: longer than its caller waits.
_PENDING_S = 60


class CancelBus:
    def __init__(self, url: str, prefix: str, gateway: Gateway) -> None:
        self.channel = f"{prefix}cancel"
        self.gateway = gateway
        self.publisher = connect(url)
        # The listener blocks on its connection until a message comes: no read timeout, but a
        # health check, so a connection Redis dropped is noticed and opened again.
        self.listener: Redis = Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=0.5, health_check_interval=15
        )
        self.listening = asyncio.Event()  # subscribed (tests wait on it)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="cancel-bus")

    async def publish(self, turn_id: str) -> bool:
        """Ask the replica running `turn_id` to cancel it; False when Redis cannot be reached."""
        try:
            async with self.publisher.pipeline(transaction=False) as pipe:
                pipe.set(self._pending(turn_id), 1, ex=_PENDING_S)
                pipe.publish(self.channel, turn_id)
                await pipe.execute()
        except ERRORS as exc:
            REDIS_ERRORS.labels("cancel_publish").inc()
            log.warning("cannot publish a cancel through Redis: %s", exc)
            return False
        return True

    async def _listen(self) -> None:
        while True:
            try:
                async with self.listener.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    # Subscribed first: a cancel is then either heard or already waiting.
                    await self._cancel_pending()
                    self.listening.set()
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._cancel(message["data"])
            except ERRORS as exc:
                self.listening.clear()
                REDIS_ERRORS.labels("cancel_listen").inc()
                log.warning("cancel listener lost Redis (%s); listening again", exc)
                await asyncio.sleep(_RETRY_S)

    def _cancel(self, turn_id: str, how: str = "") -> None:
        entry = self.gateway.cancels.by_turn.get(turn_id)
        if entry is not None and entry.cancel():
            log.info("turn %s cancelled at another replica's request%s", turn_id, how)

    async def _cancel_pending(self) -> None:
        """The turns this replica runs that were cancelled while it was not listening."""
        running = list(self.gateway.cancels.by_turn)
        if not running:
            return
        pending = await self.publisher.mget([self._pending(t) for t in running])
        for turn_id, flag in zip(running, pending, strict=True):
            if flag is not None:
                self._cancel(turn_id, " (sent while this replica was not listening)")

    def _pending(self, turn_id: str) -> str:
        return f"{self.channel}:{turn_id}"

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.listener.aclose()
        await self.publisher.aclose()
