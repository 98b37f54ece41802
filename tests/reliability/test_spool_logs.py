"""What the log says of a store outage: that writes go to the spool, once, at WARNING; that
the spool is replayed, once, at INFO; a failing heartbeat as one warning line (no ERROR, no
traceback) and its return at INFO, however many beats fail in between."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream, completion
from tests.storage.test_store_faults import ask, exactly_once, until


def said(caplog: pytest.LogCaptureFixture, text: str, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]


async def test_the_spool_and_a_failing_heartbeat_are_each_said_once(
    make_gateway: MakeGateway, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # Heartbeats every second, so that several fail while the file is locked.
    gw = await make_gateway(upstream=upstream, store={"recovery_s": 3})
    store = gw.gateway.store
    upstream.push(*[completion("answer")] * 12)
    caplog.set_level(logging.DEBUG, logger="gateway")
    holder = sqlite3.connect(gw.db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the file
    try:
        during = await ask(gw, 5)
        await until(lambda: store.spooling)
        during += await ask(gw, 5)
        await until(lambda: len(said(caplog, "heartbeat failed again", logging.DEBUG)) >= 1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await until(lambda: not store.spooling)
    await until(lambda: bool(said(caplog, "store heartbeat succeeds again", logging.INFO)))
    await gw.flush()
    exactly_once(gw, during)

    assert len(said(caplog, "writes go to the spool", logging.WARNING)) == 1
    assert len(said(caplog, "the spool is replayed", logging.INFO)) == 1
    [failed] = said(caplog, "store heartbeat failed", logging.WARNING)
    assert "database is locked" in failed.getMessage() and failed.exc_info is None
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
