"""`gateway check-config --connect`: reach what the config names, as `serve` would at start.

The store (PostgreSQL: a connection; SQLite: its directory, without creating anything), Redis
(a PING), and each upstream's and the trace collector's host (a TCP connection to its port, or
to the deployment's proxy: no request is sent, so no key leaves). Each check has `TIMEOUT_S`.
What is printed never holds a password (gateway.scrub; URLs are shown without theirs).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config import GatewayConfig
from gateway.scrub import scrub

TIMEOUT_S = 5.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Reached:
    what: str  # the config field
    where: str  # what was reached, without credentials
    error: str | None  # None: reached


async def check(config: GatewayConfig) -> list[Reached]:
    checks = [_store(config)]
    if config.limits.redis_url:
        checks.append(_redis(config.limits.redis_url))
    for origin, field in _origins(config).items():
        checks.append(_tcp(field, *origin))
    return list(await asyncio.gather(*checks))


def _origins(config: GatewayConfig) -> dict[tuple[str, int], str]:
    """Each host and port to reach once, by the first field that names it."""
    found: dict[tuple[str, int], str] = {}
    urls: list[tuple[str, str]] = []
    for i, model in enumerate(config.models):
        for j, deployment in enumerate(model.deployments):
            proxy = deployment.proxy
            direct = proxy is None or proxy.strip().lower() in ("none", "")
            url, name = (deployment.api_base, "api_base") if direct else (proxy, "proxy")
            if url:
                urls.append((f"models[{i}].deployments[{j}].{name}", url))
    if config.tracing.otlp_endpoint:
        urls.append(("tracing.otlp_endpoint", config.tracing.otlp_endpoint))
    for field, url in urls:
        parts = urlsplit(url)
        if parts.hostname:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 80)
            found.setdefault((parts.hostname, port), field)
    return found


async def _store(config: GatewayConfig) -> Reached:
    store = config.store
    if store.backend == "sqlite":
        path = store.sqlite_path.resolve()
        directory = next((p for p in (path, *path.parents) if p.exists()), path.anchor)
        target = path if path.exists() else directory
        if not os.access(target, os.W_OK):
            return Reached("store.url", str(path), f"{target} is not writable by this user")
        return Reached("store.url", str(path), None)
    from gateway.storage.postgres import PostgresBackend

    backend = PostgresBackend(store.url, 1)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await backend.start()
    except Exception as exc:
        return Reached("store.url", backend.where, _said(exc))
    finally:
        await backend.close()
    return Reached("store.url", backend.where, None)


async def _redis(url: str) -> Reached:
    from gateway.redis_client import connect

    where = _without_password(url)
    client = connect(url, timeout_s=TIMEOUT_S)
    try:
        await client.ping()
    except Exception as exc:
        return Reached("limits.redis_url", where, _said(exc))
    finally:
        await client.aclose()
    return Reached("limits.redis_url", where, None)


async def _tcp(field: str, host: str, port: int) -> Reached:
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(TIMEOUT_S):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Reached(field, where, f"no answer within {TIMEOUT_S:g} s")
    except OSError as exc:
        return Reached(field, where, _said(exc))
    writer.close()
    return Reached(field, where, None)


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return scrub(text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}")


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}***@{host}" if at and credentials else url
