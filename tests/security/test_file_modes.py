"""The store's local files are the gateway's user's alone (docs/security.md, "A local user").

The SQLite database and its `-wal` and `-shm` files, the journal and the spool hold what users
sent and received: each is created 0600, and each directory the gateway creates 0700, whatever
the umask says (here the most permissive, 000). Checked on the files a running gateway wrote.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.storage.spool import Spool
from gateway.storage.sqlite import SQLiteBackend
from gateway.storage.writes import Write
from tests.conftest import MakeGateway

HELLO = {"model": "demo", "messages": [{"role": "user", "content": "hello"}]}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """No umask: any mode the gateway does not set itself would show as world-readable."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


async def test_sqlite_files_journal_and_their_directories_are_private(
    make_gateway: MakeGateway, tmp_path: Path, open_umask: None
) -> None:
    db = tmp_path / "made" / "by-gateway" / "gateway.db"
    spool = tmp_path / "spool-made" / "here"
    gw = await make_gateway(store={"url": f"sqlite:///{db}", "spool_path": str(spool)})
    status, body = await gw.post("/v1/chat/completions", HELLO)
    assert status == 200, body
    await gw.flush()

    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *spool.glob("*.journal.*")]
    assert len(files) > 3, sorted(spool.iterdir())  # a journal segment is there
    assert {str(f): mode(f) for f in files} == {str(f): 0o600 for f in files}
    made = [db.parent, db.parent.parent, spool, spool.parent]
    assert {str(d): mode(d) for d in made} == {str(d): 0o700 for d in made}


async def test_the_spool_is_private(tmp_path: Path, open_umask: None) -> None:
    spool = Spool(tmp_path / "new" / "spool", "instance")
    spool.open()
    row: dict[str, Any] = {"id": "c", "created_at": 1.0}
    spool.append([Write("conversation", row), Write("conversation", {**row, "id": "d"})])
    spool.advance(1)  # notes a replay position: the .pos file
    for path in (spool.log_path, spool.pos_path):
        assert mode(path) == 0o600, path
    assert mode(spool.directory) == mode(spool.directory.parent) == 0o700


async def test_on_postgresql_the_spool_directory_is_private(
    make_gateway: MakeGateway, pg_url: str, tmp_path: Path, open_umask: None
) -> None:
    spool = tmp_path / "pg-spool"
    gw = await make_gateway(store={"url": pg_url, "spool_path": str(spool)})
    status, _ = await gw.post("/v1/chat/completions", HELLO)
    assert status == 200
    assert mode(spool) == 0o700


async def test_a_database_other_users_can_read_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.storage.sqlite")
    path = tmp_path / "old.db"
    path.touch()
    path.chmod(0o644)  # as an earlier gateway made it
    backend = SQLiteBackend(path)
    await backend.start()
    await backend.close()
    assert mode(path) == 0o644  # left as the operator has it...
    assert any("can be read by other local users" in r.getMessage() for r in caplog.records)
