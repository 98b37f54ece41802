"""The backlog: the writes the database has not taken yet, taken in fair turns by lane.

Every write belongs to a lane (a team, or a key of none; `None` for a write of no team, or
one that may touch any conversation: a truncation, a recovered turn's end). Within a lane,
writes are taken in the order they were submitted, which keeps each conversation's events in
order (their seqs are given as they are written). Across lanes the writer takes them in
turns, so one team's flood (a request of 2,000 messages is 2,000 writes) does not put every
other team's next turn behind it: the others' writes go into the next batch, and their turns
are durable once that batch is.

A write of lane `None` is a barrier: it is taken only after every write submitted before it,
and before any submitted after it, as if the backlog were one queue around it. Open mode (no
keys, no teams) is all barriers, and so one queue.

Each write has a number, its place in the order of submission (the store's marks count
them). `oldest()` is the first write not handled yet, so everything before it is; and
`settled(lane, mark)` says whether a lane's writes before a mark are all handled, which is
what a turn of that lane waits for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from gateway.storage.writes import Write

# Where a context's writes stand: the count of writes submitted, and the lane of its turn.
Mark = tuple[int, Hashable]


class Backlog:
    def __init__(self) -> None:
        # The writes not taken yet, in epochs split by barriers: each epoch's writes by lane,
        # a lane's in order; a lane's writes, and barriers, in an epoch before those of the
        # next (writes a failed batch put back make an epoch before the others, though other
        # lanes' older writes may be behind it). Only the first epoch is taken from.
        self._epochs: deque[dict[Hashable, deque[Write]]] = deque([{}])
        self._queued = 0
        self._taken: list[Write] = []  # the batch being handled
        self._taken_first: dict[Hashable, int] = {}  # its first write's number, by lane
        self._taken_last = -1  # its last write's number

    def __len__(self) -> int:
        """Writes queued (not taken)."""
        return self._queued

    @property
    def behind(self) -> int:
        """Writes not handled yet: queued, or taken and being handled."""
        return self._queued + len(self._taken)

    def add(self, number: int, lane: Hashable, write: Write) -> bool:
        """Queue a write; whether the backlog was empty (nothing queued) before it."""
        row = write.row
        text = row.get("payload") if write.kind == "event" else row.get("request")
        write.number = number
        write.lane = lane
        # Its weight: the length of the JSON it carries (an event's payload, a turn's or a
        # response's request); a long stream's payload, encoded only as it is written, counts
        # as a batch's worth.
        write.weight = len(text) if text.__class__ is str else 0 if text is None else 1 << 30
        was_empty = not self._queued
        self._queued += 1
        epochs = self._epochs
        epoch = epochs[-1]
        # A barrier joins only barriers before it; a write of a lane never joins barriers.
        if epoch and (lane is None) is not (None in epoch):
            epochs.append(epoch := {})
        queue = epoch.get(lane)
        if queue is None:
            epoch[lane] = deque([write])
        else:
            queue.append(write)
        return was_empty

    def take(self, limit: int, budget: int) -> list[Write]:
        """The next batch, up to `limit` writes and about `budget` of weight (the time a
        batch takes is the time its JSON takes to store): an equal share of both for each
        lane with writes queued, a lane with less leaving the rest to the others; at least
        one write of each lane. A lane taken from goes to the back of the turn."""
        epochs = self._epochs
        one = len(epochs) == 1 and not self._taken and len(epoch := epochs[0]) == 1
        if one and self._queued <= limit:
            # The usual batch: one lane's writes, all of them.
            ((lane, queue),) = epoch.items()
            if len(queue) == 1 or sum([w.weight for w in queue]) <= budget:
                epoch.clear()
                self._queued = 0
                self._taken_first = {lane: queue[0].number}
                self._taken_last = queue[-1].number
                self._taken = list(queue)
                return self._taken
        taken = self._taken
        first = self._taken_first
        weight = 0
        while len(taken) < limit and weight < budget and self._queued:
            epoch = epochs[0]
            if not epoch and len(epochs) > 1:
                epochs.popleft()
                continue
            share = max(1, (limit - len(taken)) // len(epoch))
            share_weight = max(1, (budget - weight) // len(epoch))
            for lane in list(epoch):
                queue = epoch.pop(lane)
                if lane not in first:
                    first[lane] = queue[0].number
                count = len(queue)
                # All of it, if it is within both shares (or is one write).
                carried = sum([w.weight for w in queue]) if count <= share else share_weight + 1
                if count == 1 or carried <= share_weight:
                    taken.extend(queue)
                else:
                    count = carried = 0
                    while queue and count < share and (not count or carried < share_weight):
                        write = queue.popleft()
                        taken.append(write)
                        carried += write.weight
                        count += 1
                    if queue:
                        epoch[lane] = queue  # at the back
                self._queued -= count
                weight += carried
                if taken[-1].number > self._taken_last:
                    self._taken_last = taken[-1].number
                if len(taken) >= limit or weight >= budget:
                    break
            if not epoch and len(epochs) > 1:
                epochs.popleft()
        return taken

    def done(self, handled: int) -> None:
        """The first `handled` writes of the batch are handled; the rest go back to the front
        of their lanes, to be taken first next time (nothing took them)."""
        taken = self._taken
        self._taken = []
        self._taken_first = {}
        self._taken_last = -1
        if handled < len(taken):
            back = taken[handled:]
            # Before every epoch: they were submitted before anything still queued of their
            # lane, and any barrier still queued came after them.
            front: dict[Hashable, deque[Write]] = {}
            for write in back:
                front.setdefault(write.lane, deque()).append(write)
            if None in front:  # a barrier among them: the batch goes back as one queue
                for write in reversed(back):
                    self._epochs.appendleft({write.lane: deque([write])})
            else:
                self._epochs.appendleft(front)
            self._queued += len(back)

    def count(self, lane: Hashable) -> int:
        """The writes of `lane` not handled yet."""
        queued = sum(len(epoch[lane]) for epoch in self._epochs if lane in epoch)
        if lane in self._taken_first:
            queued += sum(1 for write in self._taken if write.lane == lane)
        return queued

    def oldest(self) -> int | None:
        """The number of the first write not handled yet (None: every write is handled)."""
        if not self._queued and not self._taken:
            return None
        heads = [queue[0].number for epoch in self._epochs for queue in epoch.values()]
        if self._taken_first:
            heads += self._taken_first.values()
        return min(heads)

    def settled(self, lane: Hashable, mark: int) -> bool:
        """Whether every write of `lane` numbered below `mark` is handled."""
        first = self._taken_first.get(lane)
        if first is not None and first < mark:
            return False
        for epoch in self._epochs:  # the lane's oldest queued write is in the first it is in
            queue = epoch.get(lane)
            if queue:
                return queue[0].number >= mark
        return True

    def unhandled(self, since: int = 0) -> list[Write]:
        """The writes numbered `since` or later not handled yet (taken or queued), in the
        order they were submitted. Those are usually the last few: each queue is read from
        its end."""
        found = [w for w in self._taken if w.number >= since] if self._taken_last >= since else []
        sources = len(self._taken_first) if found else 0  # the batch: lane after lane
        for epoch in self._epochs:
            for queue in epoch.values():
                if queue[-1].number < since:
                    continue
                sources += 1
                if queue[0].number >= since:
                    found.extend(queue)
                    continue
                tail = []
                for write in reversed(queue):
                    if write.number < since:
                        break
                    tail.append(write)
                tail.reverse()
                found.extend(tail)
        if sources > 1:
            found.sort(key=_number)
        return found


def _number(write: Write) -> int:
    return write.number
