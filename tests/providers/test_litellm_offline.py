"""A litellm deployment with no route out: `gateway serve` starts and answers its first stream
reaching nothing but the provider (a fake on loopback), and without waiting on a download.

The gateway runs as its own process, in which every connection or name lookup for a host other
than loopback is refused and written down (a `sitecustomize` the test puts first on the path),
and whose proxy variables point at a closed port, as on a machine with no network. The model is
one litellm would count with a Hugging Face tokenizer (Llama's) fetched on first use, of a
provider litellm drives (Together AI's; Groq, once the example, is now read by the gateway
itself).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.fakes import FakeUpstream, MakeServer
from tests.providers.test_adapter_contract import ANSWER, LITELLM_SKIP

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

# Refuses, and appends to $BLOCKED_LOG, every lookup or connection beyond loopback, and every
# connection to the proxy the environment names (a closed port).
GUARD = """
import ipaddress, os, socket

_LOG = os.environ["BLOCKED_LOG"]
_LOCAL = {"localhost", "127.0.0.1", "::1", "", None}


def _local(host):
    if host in _LOCAL:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse(what):
    with open(_LOG, "a") as log:
        log.write(what + "\\n")
    raise OSError(101, "Network is unreachable (blocked by the test)")


_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, *args, **kwargs):
    if isinstance(host, bytes):
        host = host.decode()
    if not _local(host):
        _refuse(f"getaddrinfo {host}")
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = getaddrinfo
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


_PROXY_PORT = int(os.environ["BLOCKED_PROXY_PORT"])


def _check(address):
    if isinstance(address, tuple) and not _local(address[0]):
        _refuse(f"connect {address[0]}")
    if isinstance(address, tuple) and address[1] == _PROXY_PORT:
        _refuse(f"connect to the proxy {address[0]}:{address[1]}")


def connect(self, address):
    _check(address)
    return _connect(self, address)


def connect_ex(self, address):
    _check(address)
    return _connect_ex(self, address)


socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
"""

FIRST_BYTE_BUDGET_S = 8  # a tokenizer download retried with no network took 24-27 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def offline_environment(tmp_path: Path) -> tuple[dict[str, str], Path]:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    blocked = tmp_path / "blocked.log"
    blocked.write_text("")
    proxy_port = free_port()
    closed = f"http://127.0.0.1:{proxy_port}"
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(guard), str(Path.cwd())]),
            "BLOCKED_LOG": str(blocked),
            "BLOCKED_PROXY_PORT": str(proxy_port),
            "HTTPS_PROXY": closed,
            "HTTP_PROXY": closed,
            "ALL_PROXY": closed,
            "NO_PROXY": "127.0.0.1,localhost",
            "TOGETHERAI_API_KEY": "tg-fake",
        }
    )
    return env, blocked


async def wait_live(url: str, process: asyncio.subprocess.Process, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise AssertionError(f"gateway exited with {process.returncode}")
            try:
                async with session.get(url + "/health/live") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("gateway did not come up")


async def test_start_and_first_stream_reach_nothing_but_the_provider(
    aiohttp_server: MakeServer, tmp_path: Path
) -> None:
    upstream = await FakeUpstream().start(aiohttp_server)
    upstream.text(ANSWER)
    port = free_port()
    config = {
        "server": {"port": port},
        "store": {"url": f"sqlite:///{tmp_path / 'gateway.db'}"},
        "models": [
            {
                "name": "m",
                "retry": {"max_attempts": 1},
                "deployments": [
                    {
                        "provider": "litellm",
                        "model": "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo",
                        "api_base": upstream.url,
                        "api_key": "${TOGETHERAI_API_KEY}",
                    }
                ],
            }
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env, blocked = offline_environment(tmp_path)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(path),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_live(url, process, time.monotonic() + 60)
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        started = time.monotonic()
        first_byte: float | None = None
        received = b""
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                async for piece in response.content.iter_any():
                    if first_byte is None:
                        first_byte = time.monotonic() - started
                    received += piece
    finally:
        process.terminate()
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert first_byte is not None
    assert all(part.encode() in received for part in ANSWER), received[-500:]
    assert received.rstrip().endswith(b"data: [DONE]")
    assert len(upstream.requests) == 1
    assert blocked.read_text() == "", (
        f"outbound network attempted:\n{blocked.read_text()}\n{stderr.decode()[-2000:]}"
    )
    assert first_byte < FIRST_BYTE_BUDGET_S, f"first byte after {first_byte:.1f} s"
    print(f"first stream's first byte after {first_byte:.2f} s")
