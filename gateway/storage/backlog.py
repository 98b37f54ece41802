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
from collections.abc import Hashable, Iterator

from gateway.storage.writes import Write

# A write as the backlog holds it: its number, its lane, the write, its weight (the length
# of the JSON it carries).
Entry = tuple[int, Hashable, Write, int]
# Where a context's writes stand: the count of writes submitted, and the lane of its turn.
Mark = tuple[int, Hashable]


class Backlog:
    def __init__(self) -> None:
        # The writes not taken yet, in epochs split by barriers: each epoch's writes by lane,
        # a lane's in order. Only the first epoch is taken from.
        self._epochs: deque[dict[Hashable, deque[Entry]]] = deque([{}])
        self._queued = 0
        self._unhandled_count = 0
        # The numbers of each lane's writes not handled yet (queued or taken), oldest first.
        self._unhandled: dict[Hashable, deque[int]] = {}
        self._taken: list[Entry] = []  # the batch being handled

    def __len__(self) -> int:
        """Writes queued (not taken)."""
        return self._queued

    @property
    def behind(self) -> int:
        """Writes not handled yet: queued, or taken and being handled."""
        return self._unhandled_count

    def add(self, number: int, lane: Hashable, write: Write) -> None:
        entry = (number, lane, write, _weight(write))
        epochs = self._epochs
        if lane is None:
            if self._queued:  # behind everything queued, ahead of everything after it
                epochs.append({None: deque([entry])})
                epochs.append({})
            else:
                epochs[-1][None] = deque([entry])
        else:
            epoch = epochs[-1]
            if None in epoch:  # a barrier alone in the epoch ended it
                epochs.append(epoch := {})
            queue = epoch.get(lane)
            if queue is None:
                epoch[lane] = deque([entry])
            else:
                queue.append(entry)
        self._queued += 1
        self._unhandled_count += 1
        numbers = self._unhandled.get(lane)
        if numbers is None:
            self._unhandled[lane] = deque([number])
        else:
            numbers.append(number)

    def take(self, limit: int, budget: int) -> list[Write]:
        """The next batch, up to `limit` writes and about `budget` of weight (the time a
        batch takes is the time its JSON takes to store): an equal share of both for each
        lane with writes queued, a lane with less leaving the rest to the others; at least
        one write of each lane. A lane taken from goes to the back of the turn."""
        taken = self._taken
        epochs = self._epochs
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
                count = carried = 0
                while queue and count < share and (not count or carried < share_weight):
                    entry = queue.popleft()
                    taken.append(entry)
                    carried += entry[3]
                    count += 1
                if queue:
                    epoch[lane] = queue  # at the back
                self._queued -= count
                weight += carried
                if len(taken) >= limit or weight >= budget:
                    break
            if not epoch and len(epochs) > 1:
                epochs.popleft()
        return [entry[2] for entry in taken]

    @property
    def taken(self) -> list[Write]:
        """The batch being handled (empty between batches)."""
        return [entry[2] for entry in self._taken]

    def done(self, handled: int) -> None:
        """The first `handled` writes of the batch are handled; the rest go back to the front
        of their lanes, to be taken first next time (nothing took them)."""
        taken, self._taken = self._taken, []
        unhandled = self._unhandled
        self._unhandled_count -= handled
        for _, lane, _, _ in taken[:handled]:
            numbers = unhandled[lane]
            numbers.popleft()
            if not numbers:
                del unhandled[lane]
        back = taken[handled:]
        if back:
            # Before every epoch: they were submitted before anything still queued of their
            # lane, and any barrier still queued came after them.
            front: dict[Hashable, deque[Entry]] = {}
            for entry in back:
                front.setdefault(entry[1], deque()).append(entry)
            if None in front:  # a barrier among them: the batch goes back as one queue
                for entry in reversed(back):
                    self._epochs.appendleft({entry[1]: deque([entry])})
            else:
                self._epochs.appendleft(front)
            self._queued += len(back)

    def count(self, lane: Hashable) -> int:
        """The writes of `lane` not handled yet."""
        numbers = self._unhandled.get(lane)
        return len(numbers) if numbers else 0

    def oldest(self) -> int | None:
        """The number of the first write not handled yet (None: every write is handled)."""
        return min((numbers[0] for numbers in self._unhandled.values()), default=None)

    def settled(self, lane: Hashable, mark: int) -> bool:
        """Whether every write of `lane` numbered below `mark` is handled."""
        numbers = self._unhandled.get(lane)
        return not numbers or numbers[0] >= mark

    def unhandled(self, since: int = 0) -> list[Write]:
        """The writes numbered `since` or later not handled yet (taken or queued), in the
        order they were submitted."""
        found = [entry for entry in self._taken if entry[0] >= since]
        for entry in self._entries_since(since):
            found.append(entry)
        found.sort(key=_number)
        return [entry[2] for entry in found]

    def _entries_since(self, since: int) -> Iterator[Entry]:
        for epoch in self._epochs:
            for queue in epoch.values():
                if queue[-1][0] < since:
                    continue
                for entry in reversed(queue):
                    if entry[0] < since:
                        break
                    yield entry


def _number(entry: Entry) -> int:
    return entry[0]


def _weight(write: Write) -> int:
    """The length of the JSON a write carries: an event's payload, a turn's or a response's
    request; a long stream's payload (encoded only as it is written) counts as a batch's
    worth."""
    row = write.row
    text = row.get("payload") if write.kind == "event" else row.get("request")
    if text.__class__ is str:
        return len(text)
    return 0 if text is None else 1 << 30
