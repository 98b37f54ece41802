"""The journal: a turn's writes, appended to a local file before its client sees the end.

A turn is durable before its last bytes reach the client: nothing a user saw is lost
(docs/recording.md, "When a turn is durable"). Waiting for the database's commit costs every
request a hand-off to the store's thread and a commit of its own; a SQLite commit in WAL mode
with `synchronous=NORMAL` is itself only a `write()` into the log, which survives the process
but not the machine. An append of the same writes to this file, with one `write()` on the event
loop's thread, is as durable, and the database then commits them in its own time, many turns a
transaction.

Writes are appended to numbered segments, `<name>.journal.<n>`, one append a line: a JSON
array of its writes as `[kind, row]` pairs, made by one orjson call (a turn's half-dozen writes
encoded one by one, as the spool keeps them, would cost more on every request). A line torn
by a crash is a whole append lost, never part of one: an append counts only once written.
A segment is removed once the database has every write in it (or the spool has them, which
fsyncs); the newest is emptied rather than removed. What a crash leaves is put into the
database before the next start serves anything; writes are idempotent, so one that was also
committed lands once. Only for a store on this machine's disk (SQLite): a PostgreSQL commit
is durable on the server, which a file beside a replica is not.
"""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path

import orjson

from gateway.storage.payload import as_text
from gateway.storage.spool import PRIVATE_FILE, private_dir
from gateway.storage.writes import Write

SEGMENT_BYTES = 4 * 1024 * 1024


class Journal:
    def __init__(self, directory: Path | str, name: str) -> None:
        self.directory = Path(directory)
        self._name = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".journal."
        self._fd = -1
        self._number = 0  # of the segment being appended to
        self._size = 0  # its size
        self._mark = 0  # the count of writes submitted whose lines it holds
        self._full: deque[tuple[Path, int]] = deque()  # older segments, and their marks

    def left_behind(self) -> list[Path]:
        """The segments a previous life of this process left, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            suffix = path.name.removeprefix(self._name)
            if suffix != path.name and suffix.isdigit():
                found.append((int(suffix), path))
        return [path for _, path in sorted(found)]

    @staticmethod
    def read(path: Path) -> list[Write]:
        """A left segment's writes; a last line torn by the crash was never acknowledged."""
        writes: list[Write] = []
        for line in path.read_bytes().split(b"\n")[:-1]:
            if line.startswith(b"["):
                writes.extend(Write(kind, row) for kind, row in orjson.loads(line))
            else:  # one write a line, in the spool's encoding: left by an earlier gateway
                writes.append(Write.decode(line))
        return writes

    def open(self) -> None:
        """Start appending, after `left_behind()` segments are in the database and removed."""
        private_dir(self.directory)  # 0700 when made here; segments are 0600 (storage.spool)
        self._next_segment()

    def append(self, writes: list[Write], mark: int) -> None:
        """Append `writes`, the last of them the `mark`th write submitted. Raises OSError
        (then nothing of them counts as journaled)."""
        # Every JSON column is queued as text (Store and the writers beside it encode it);
        # `as_text` keeps the bytes the spool's encoding accepted from failing an append.
        data = orjson.dumps([(w.kind, w.row) for w in writes], default=as_text) + b"\n"
        if self._size + len(data) > SEGMENT_BYTES and self._size:
            self._full.append((self._path(self._number), self._mark))
            os.close(self._fd)
            self._next_segment()
        try:
            written = os.write(self._fd, data)
        except OSError:
            os.ftruncate(self._fd, self._size)  # no torn line in front of the next append
            raise
        if written != len(data):  # a full disk can take part of it
            os.ftruncate(self._fd, self._size)
            raise OSError("the journal took only part of an append")
        self._size += written
        self._mark = mark

    def handled(self, count: int) -> None:
        """The first `count` writes submitted are in the database (or the spool)."""
        while self._full and self._full[0][1] <= count:
            self._full.popleft()[0].unlink(missing_ok=True)
        if self._size and self._mark <= count and not self._full:
            os.ftruncate(self._fd, 0)
            self._size = 0

    def close(self) -> None:
        """Everything is in the database: no segment is needed any more."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for path, _ in self._full:
            path.unlink(missing_ok=True)
        self._full.clear()
        self._path(self._number).unlink(missing_ok=True)

    def _path(self, number: int) -> Path:
        return self.directory / f"{self._name}{number}"

    def _next_segment(self) -> None:
        self._number += 1
        self._fd = os.open(
            self._path(self._number),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            PRIVATE_FILE,
        )
        self._size = 0
