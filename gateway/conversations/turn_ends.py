"""Non-streaming answers that completed in one iteration of the event loop, recorded together.

Recording a turn's end (its blocks, compact stream, usage row and events: `completed()`) runs
several times faster with its code and data in the CPU's caches than run once between the rest
of a request, which evicts them (docs/decisions.md, "Turn ends recorded together"). Under load
several answers come in the same loop iteration; recorded back to back, at the end of it, all
but the first find that code warm, and the first of their handlers to go on puts all of their
writes into the journal in one append.

The end is decided when the answer has come whole; it is recorded one loop iteration later,
before the client can see it (each handler waits for its turn's future, then for the
journal). A client that leaves in between has its handler cancelled, which records the turn
as it does any other (it got nothing): the batch then leaves that turn alone.
"""

from __future__ import annotations

import asyncio

from gateway.conversations.recorder import Attempt, TurnRecorder


class TurnEnds:
    def __init__(self) -> None:
        self._pending: list[tuple[TurnRecorder, Attempt, asyncio.Future[None]]] = []

    def completed(self, turn: TurnRecorder, attempt: Attempt) -> asyncio.Future[None]:
        """Record `turn` as completed by `attempt` once this loop iteration's handlers have run;
        the future is done when it is recorded (or holds what recording it raised)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()  # one per turn: a cancelled handler cancels only its own
        if not self._pending:
            loop.call_soon(self._record)
        self._pending.append((turn, attempt, future))
        return future

    def _record(self) -> None:
        pending, self._pending = self._pending, []
        for turn, attempt, future in pending:
            try:
                if not turn.ended:  # else its client left meanwhile, and that was recorded
                    turn.completed(attempt)
            except Exception as exc:  # that turn's handler reports it, as if it had called
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(None)
