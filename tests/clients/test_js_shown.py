"""clients/js/gateway-shown.mjs with the real openai-node, Vercel AI SDK and @anthropic-ai/sdk
(tests/js/shown.mjs): an app that renders slowly and stops leaves the record equal to what it
showed, byte for byte.

The script renders a few pieces and says so; the test waits until the gateway has recorded the
turn's end (the whole answer reached the script's socket), then tells it to stop.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, FakeUpstream, chunk, paused

JS = Path(__file__).parents[1] / "js"
NODE = shutil.which("node")
TIMEOUT_S = 60
PARTS = [f"{i}. {tip} " for i, tip in enumerate(["Eat 🍎", "Sleep 睡觉", "Walk 🚶", "Read"] * 4)]
TEXT = "".join(PARTS)

pytestmark = pytest.mark.skipif(
    NODE is None or not (JS / "node_modules").is_dir(),
    reason="needs node and tests/js/node_modules: `make test` installs both (npm ci)",
)


async def slow_reader(
    gw: GatewayUnderTest,
    style: str,
    pieces: int,
    wait_for_the_end: bool = True,
    on_refused: Callable[[], Any] | None = None,
    url: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Run tests/js/shown.mjs: (its result, the turn's end status when it was told to stop, or
    "" when told at once). The script stops at a report answered 409 until `on_refused` has
    been called. `url`: another server than the gateway."""
    assert NODE is not None
    process = await asyncio.create_subprocess_exec(
        NODE,
        "--import",
        "./no-network.mjs",
        "shown.mjs",
        cwd=JS,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "GATEWAY_URL": url or gw.url,
            "GATEWAY_KEY": "test-key",
            "NODE_NO_WARNINGS": "1",
            "STYLE": style,
            "PIECES": str(pieces),
            "WATCH_REPORTS": "1",
        },
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        async with asyncio.timeout(TIMEOUT_S):
            status = ""
            result: dict[str, Any] | None = None
            reports: list[int] = []
            async for raw in process.stdout:
                line = raw.decode()
                if line.startswith("READY ") and wait_for_the_end:
                    conversation_id = json.loads(line.removeprefix("READY "))["conversationId"]
                    events = await gw.wait_turn_end(conversation_id)
                    status = next(e["payload"]["status"] for e in events if e["type"] == "turn/end")
                if line.startswith("READY "):
                    process.stdin.write(b"stop\n")
                    await process.stdin.drain()
                elif line.startswith("REPORT "):
                    reports.append(int(line.removeprefix("REPORT ")))
                    if reports[-1] == 409:
                        if on_refused is not None:
                            on_refused()
                        process.stdin.write(b"go on\n")
                        await process.stdin.drain()
                elif line.startswith("RESULT "):
                    result = json.loads(line.removeprefix("RESULT "))
            assert process.stderr is not None
            stderr = (await process.stderr.read()).decode(errors="replace")
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert "NETWORK:" not in stderr, stderr
    assert process.returncode == 0 and result is not None, stderr
    result["reports"] = reports
    return result, status


@pytest.mark.parametrize(
    "style", ["openai_chat", "openai_responses", "anthropic", "anthropic_events", "vercel"]
)
async def test_a_slow_js_reader_that_stops_is_recorded_as_it_showed(
    gw: GatewayUnderTest, upstream: FakeUpstream, style: str
) -> None:
    upstream.text(PARTS)
    result, status = await slow_reader(gw, style, pieces=3)
    assert status == "completed"  # the whole answer had reached the script's socket
    shown = result["shown"]
    assert TEXT.startswith(shown) and 0 < len(shown) < len(TEXT), shown
    truncation = result["truncation"]
    assert truncation is not None and truncation["content"] == shown
    assert result["reports"] == [200]  # the turn had ended: one report, taken
    messages = await gw.messages(truncation["conversation_id"])
    assert messages[-1] == {"role": "assistant", "content": shown}


@pytest.mark.parametrize("style", ["openai_chat", "anthropic", "vercel"])
async def test_a_js_stop_while_the_answer_streams_is_recorded_as_shown(
    gw: GatewayUnderTest, upstream: FakeUpstream, style: str
) -> None:
    """The turn is still running when the app stops: the helper's report waits for its end."""
    upstream.stall_after(PARTS)
    result, _ = await slow_reader(gw, style, pieces=3, wait_for_the_end=False)
    truncation = result["truncation"]
    assert truncation is not None and truncation["content"] == result["shown"]
    assert result["reports"][-1] == 200
    conversation_id = truncation["conversation_id"]
    events = await gw.wait_turn_end(conversation_id)
    assert next(e["payload"]["status"] for e in events if e["type"] == "turn/end") == "aborted"
    messages = await gw.messages(conversation_id)
    assert messages[-1] == {"role": "assistant", "content": result["shown"]}


async def test_a_js_report_sent_before_the_turn_has_ended_is_sent_again(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    """The turn ends only once the upstream is drained (`on_client_disconnect: drain`), which
    the test holds back until the helper's first report was answered `409 turn_in_progress`."""
    fake = await make_upstream()
    model = {
        "name": "fake",
        "on_client_disconnect": "drain",
        "deployments": [{"provider": "openai", "api_base": fake.url}],
    }
    gw = await make_gateway(models=[model])
    fake.push(paused([chunk(p) for p in PARTS[:4]], [chunk(finish="stop"), DONE]))
    result, _ = await slow_reader(
        gw, "openai_chat", pieces=2, wait_for_the_end=False, on_refused=fake.release.set
    )
    assert result["reports"][0] == 409 and result["reports"][-1] == 200
    shown = "".join(PARTS[:2])
    assert result["shown"] == shown and result["truncation"]["content"] == shown
    messages = await gw.messages(result["truncation"]["conversation_id"])
    assert messages[-1] == {"role": "assistant", "content": shown}


async def test_a_js_app_on_a_server_that_is_not_the_gateway_reports_nothing(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.text(PARTS)
    root = upstream.url.removesuffix("/v1")
    result, _ = await slow_reader(gw, "openai_chat", pieces=2, wait_for_the_end=False, url=root)
    assert result["shown"] == "".join(PARTS[:2])
    assert result["truncation"] is None and result["reports"] == []
    assert len(upstream.requests) == 1
