"""The app's resources start in order and close on their own: a start that fails part way
closes exactly what had started, and a clean stop closes everything."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewayConfig, parse_config
from gateway.upstream.tls import TrustError


def config(tmp_path: Path) -> GatewayConfig:
    return parse_config(
        {
            "store": {"url": f"sqlite:///{tmp_path}/gateway.db", "spool_path": str(tmp_path)},
            "auth": {"master_key": "m" * 24},
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {"provider": "openai", "model": "m", "api_base": "http://127.0.0.1:9/v1"}
                    ],
                }
            ],
        }
    ).config


def store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sqlite-")]


def gateway_tasks() -> set[str]:
    return {t.get_name() for t in asyncio.all_tasks()} & {"store-heartbeat", "checkpoints"}


async def test_a_start_that_fails_after_the_store_closes_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The upstream pool reads the trust store's variables when it starts, after the store.
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    before = store_threads()
    runner = web.AppRunner(create_app(config(tmp_path), instance="fails"))
    with pytest.raises(TrustError, match="SSL_CERT_FILE"):
        await runner.setup()
    assert len(store_threads()) > len(before)  # the store had started
    await runner.cleanup()
    assert store_threads() == before
    assert not gateway_tasks()  # nothing after the failure was started


async def test_a_clean_stop_closes_every_resource(tmp_path: Path) -> None:
    before = store_threads()
    runner = web.AppRunner(create_app(config(tmp_path), instance="stops"))
    await runner.setup()
    assert gateway_tasks() == {"store-heartbeat", "checkpoints"}
    await runner.cleanup()
    assert store_threads() == before
    assert not gateway_tasks()
