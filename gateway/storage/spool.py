"""The spool: an append-only local file that keeps writes while the database cannot take them.

`<name>.log` holds one encoded write per line, appended and fsync'd a batch at a time;
`<name>.pos` holds how far replay has got (replaced atomically after each replayed batch). A
process that dies mid-replay starts again from the last noted position; writes are idempotent,
so a batch applied but not yet noted lands once. Methods block on the disk: call them from a
thread.

The spool, the journal and the SQLite database hold what users sent and received: each file is
created 0600 and each directory the gateway creates 0700 (`private_dir`, `create_private`),
whatever the umask, so no other local user can read them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gateway.storage.writes import Write

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: Path) -> None:
    """Make the directory `path`, and any missing parents, each 0700 (the umask can only take
    more away); one that exists is left as it is."""
    missing: list[Path] = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            pass  # made meanwhile by another process


def create_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Open `path` with `flags`, created 0600 if it does not exist; its descriptor."""
    return os.open(path, flags | os.O_CREAT, PRIVATE_FILE)


class Spool:
    def __init__(self, directory: Path | str, name: str) -> None:
        self.directory = Path(directory)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        self.log_path = self.directory / f"{safe}.log"
        self.pos_path = self.directory / f"{safe}.pos"
        self._pos = 0
        self._size = 0

    def open(self) -> None:
        private_dir(self.directory)
        self._size = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self._pos = int(self.pos_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            self._pos = 0
        self._pos = min(self._pos, self._size)
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        """A crash mid-append can leave a last line without its newline: it was never
        acknowledged, and appending after it would corrupt the next record."""
        if self._size == 0:
            return
        with open(self.log_path, "rb+") as file:
            end = self._size
            while end > 0:
                start = max(0, end - 65536)
                file.seek(start)
                chunk = file.read(end - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    end = start + newline + 1
                    break
                end = start
            if end != self._size:
                file.truncate(end)
                self._size = end
                self._pos = min(self._pos, end)

    @property
    def pending_bytes(self) -> int:
        return self._size - self._pos

    def append(self, writes: list[Write]) -> None:
        data = b"".join([w.line() for w in writes])
        with os.fdopen(create_private(self.log_path), "ab") as file:
            try:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            except OSError:
                # A partial append (disk full) must not leave a torn record for the next one.
                file.truncate(self._size)
                raise
        self._size += len(data)

    def read(self, limit: int) -> tuple[list[Write], int]:
        """Up to `limit` writes from the replay position, and the position after them."""
        writes: list[Write] = []
        pos = self._pos
        if pos >= self._size:
            return writes, pos
        with open(self.log_path, "rb") as file:
            file.seek(pos)
            while len(writes) < limit:
                line = file.readline()
                if not line.endswith(b"\n"):
                    break  # end of file, or a line torn by a crash mid-append: not acknowledged
                pos += len(line)
                writes.append(Write.decode(line))
        return writes, pos

    def advance(self, pos: int) -> None:
        """Note that everything before `pos` is in the database."""
        if pos >= self._size:
            self.reset()
            return
        tmp = self.pos_path.with_suffix(".pos.tmp")
        with os.fdopen(create_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as file:
            file.write(str(pos).encode())
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, self.pos_path)
        self._pos = pos

    def reset(self) -> None:
        """Everything is replayed: start an empty log."""
        self.log_path.unlink(missing_ok=True)
        self.pos_path.unlink(missing_ok=True)
        self._pos = self._size = 0
