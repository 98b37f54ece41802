"""What keeps `gateway serve` quick to its first answer: modules it does not need stay unimported,
the collector is off while it starts, and the tokenizer loads after a moment, not at once."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from importlib import import_module

import pytest

from gateway.metering import tokens

# Needed only by some deployments or configs (litellm, Redis, PostgreSQL), by the estimate of a
# cut stream (tiktoken), or by operator routes, imported on their first request.
NOT_AT_START = (
    "litellm",
    "tiktoken",
    "redis",
    "asyncpg",
    "gateway.http.admin",
    "gateway.http.conversations_list",
    "gateway.http.openapi",
    "gateway.http.openapi_schemas",
    "gateway.http.ui",
    "gateway.http.usage",
    "gateway.metering.admin",
    "gateway.conversations.listing",
)


def imported_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_the_app_imports_nothing_it_needs_only_later() -> None:
    modules = imported_after(
        "import gateway.cli, gateway.config, gateway.app\n"
        "from gateway.app import create_app\n"
        "from gateway.config import parse_config\n"
        "create_app(parse_config({}).config)"
    )
    assert "gateway.app" in modules
    assert sorted(m for m in NOT_AT_START if m in modules) == []


def test_serving_a_completion_and_an_estimate_needs_no_litellm() -> None:
    # The tokenizer files and the price map ship inside litellm; they are read as files.
    modules = imported_after(
        "import asyncio\n"
        "from aiohttp.test_utils import TestClient, TestServer\n"
        "from gateway.app import create_app\n"
        "from gateway.config import parse_config\n"
        "from gateway.metering import tokens\n"
        "config = parse_config({'store': {'url': 'sqlite:///:memory:'}, 'models': [{'name':"
        " 'demo', 'deployments': [{'provider': 'demo', 'chunk_delay_ms': 0}]}]}).config\n"
        "async def main():\n"
        "    async with TestClient(TestServer(create_app(config))) as client:\n"
        "        body = {'model': 'demo', 'messages': [{'role': 'user', 'content': 'hi'}]}\n"
        "        response = await client.post('/v1/chat/completions', json=body)\n"
        "        assert response.status == 200, await response.text()\n"
        "        assert tokens.count_text('hello') >= 1\n"
        "asyncio.run(main())"
    )
    assert "gateway.pipeline" in modules and "tiktoken" in modules
    assert "litellm" not in modules


def test_the_cli_module_leaves_the_heavy_imports_to_main() -> None:
    # main() turns the collector off before aiohttp and pydantic load; importing them at the
    # top of gateway.cli would load them with it still on.
    modules = imported_after("import gateway.cli")
    assert not {"aiohttp", "pydantic", "asyncio", "gateway.config"} & modules


def test_every_route_names_a_handler_that_exists() -> None:
    from gateway.app import create_app
    from gateway.config import parse_config

    app = create_app(parse_config({}).config)
    for route in app.router.routes():
        handler = route.handler
        module = import_module(handler.__module__)
        assert callable(getattr(module, handler.__name__)), (route.method, route.resource)


def test_main_turns_the_collector_back_on() -> None:
    from gateway.cli import main

    assert main(["check-config", "--config", "config/gateway.yaml"]) == 0
    assert gc.isenabled()


@pytest.fixture
def unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer as if this process had not loaded it yet (the real one is kept aside)."""
    monkeypatch.setattr(tokens, "_loaded", tokens._UNLOADED)
    monkeypatch.setattr(tokens, "_stopping", threading.Event())


def test_warm_waits_then_loads(unloaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[float] = []
    monkeypatch.setattr(tokens, "_read_encoding", lambda: loads.append(time.monotonic()))
    started = time.monotonic()
    tokens.warm(delay_s=0.2)
    assert len(loads) == 1 and loads[0] - started >= 0.2
    tokens.warm(delay_s=5)  # loaded: returns at once
    assert len(loads) == 1


def test_a_stopping_gateway_skips_a_warm_that_has_not_begun(
    unloaded: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[int] = []
    monkeypatch.setattr(tokens, "_read_encoding", lambda: loads.append(1))
    waiting = threading.Thread(target=tokens.warm, kwargs={"delay_s": 30})
    waiting.start()
    tokens.skip_warm()
    waiting.join(timeout=5)
    assert not waiting.is_alive() and loads == []


def test_an_estimate_during_the_warm_up_waits_for_it_instead_of_loading_again(
    unloaded: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[int] = []
    release = threading.Event()

    def slow_load() -> None:
        loads.append(1)
        release.wait(5)

    monkeypatch.setattr(tokens, "_read_encoding", slow_load)
    warming = threading.Thread(target=tokens.warm, kwargs={"delay_s": 0})
    warming.start()
    while not loads:
        time.sleep(0.001)
    estimating = threading.Thread(target=tokens.count_text, args=("hello",))
    estimating.start()
    time.sleep(0.05)
    assert estimating.is_alive()  # waiting on the load under way
    release.set()
    warming.join(5)
    estimating.join(5)
    assert loads == [1]


def test_requests_in_flight_do_not_set_off_young_collections() -> None:
    from gateway.cli import settle_collector

    threshold = gc.get_threshold()
    try:
        settle_collector()
        before = gc.get_stats()[0]["collections"]
        # About what 32 streams in flight hold: live objects, no garbage to find.
        in_flight = [[{"n": i}, (i, [i])] for i in range(1_500)]
        assert gc.get_stats()[0]["collections"] == before
        del in_flight
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
