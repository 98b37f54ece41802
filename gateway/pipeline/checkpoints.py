"""Delivery checkpoints: what each streaming turn's client has, written to the store a few
times a second, so that a turn whose process dies is closed with its delivered prefix
(gateway.conversations.recovery; docs/operations.md, "Stopping and crashing").

One task per process takes them: each tick it asks every relay running for a checkpoint
(only those whose client got frames since the last one answer) and writes them all, and drops
those of turns that ended, in one transaction. Nothing is written per chunk, and nothing when
no stream moved. A checkpoint the store cannot take is skipped: the next one supersedes it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from gateway.context import Gateway
from gateway.pipeline.relay import Relay

log = logging.getLogger(__name__)

# A crash loses at most this much of what was delivered, plus a write's time.
INTERVAL_S = 0.2


class Checkpoints:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.saved: set[str] = set()  # turns with a checkpoint in the store

    async def run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_S)
            try:
                await self.tick()
            except Exception as exc:  # the store down or slow: the next tick tries again
                log.debug("checkpoint skipped: %s", exc)

    async def tick(self) -> None:
        taken, rows, ended = self.take()
        if not rows and not ended:
            return
        try:
            await self.gateway.store.save_checkpoints(rows, ended)
        except BaseException:
            for relay in taken:  # not saved: taken again next tick, moved or not
                relay.checkpointed = 0
            raise
        self.saved = (self.saved - ended) | {row[0] for row in rows}

    def take(self) -> tuple[list[Relay], list[tuple[str, str, float, str]], set[str]]:
        """The relays that moved and their checkpoint rows; the saved turns that ended."""
        rows: list[tuple[str, str, float, str]] = []
        taken: list[Relay] = []
        live: set[str] = set()
        now = time.time()
        for entry in list(self.gateway.running):
            if not isinstance(entry, Relay) or entry.turn.ended:
                continue
            turn = entry.turn
            live.add(turn.turn_id)
            body = entry.checkpoint()
            if body is not None:
                rows.append((turn.turn_id, turn.conversation_id, now, orjson.dumps(body).decode()))
                taken.append(entry)
        return taken, rows, self.saved - live
