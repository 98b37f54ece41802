"""From `store:` config to a running Store, and who this process is in it."""

from __future__ import annotations

import os
import socket

from gateway.config import StoreConfig
from gateway.storage.journal import Journal
from gateway.storage.spool import Spool
from gateway.storage.sqlite import SQLiteBackend
from gateway.storage.store import Backend, Store


def instance_id(port: int) -> str:
    """A name for this process that its restart reuses, so the restart knows that the turns
    left open under that name are orphans: host, port and worker number. Port 0 (tests) has no
    stable identity: a random one."""
    explicit = os.environ.get("GATEWAY_INSTANCE_ID")
    if explicit:
        return explicit
    host = socket.gethostname()
    if port == 0:
        return f"{host}:{os.getpid()}:{os.urandom(4).hex()}"
    worker = os.environ.get("GATEWAY_WORKER")
    return f"{host}:{port}" + (f":w{worker}" if worker else "")


def make_backend(config: StoreConfig) -> Backend:
    if config.backend == "sqlite":
        return SQLiteBackend(config.sqlite_path)
    from gateway.storage.postgres import PostgresBackend  # asyncpg only when configured

    return PostgresBackend(config.url, config.pool_size)


def make_store(config: StoreConfig, owner: str, *, migrate: bool | None = None) -> Store:
    journaled = config.backend == "sqlite" if config.journal is None else config.journal
    return Store(
        make_backend(config),
        Spool(config.spool_path, owner),
        owner=owner,
        queue_max=config.queue_max,
        migrate=config.migrate_on_start if migrate is None else migrate,
        journal=Journal(config.spool_path, owner) if journaled else None,
    )
