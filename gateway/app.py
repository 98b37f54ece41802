"""create_app(config): wiring only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from gateway import metrics, scrub
from gateway.config import GatewayConfig
from gateway.context import GATEWAY, Gateway
from gateway.conversations.recovery import recover_open_turns
from gateway.conversations.service import Conversations
from gateway.downstream.slow_clients import request_limits
from gateway.heartbeat import keep_alive
from gateway.http.auth import authenticate
from gateway.http.auth_failures import FAILED_KEYS, FailedKeys
from gateway.http.cors import CORS, Cors
from gateway.http.host_guard import HostGuard
from gateway.http.middleware import add_request_id, errors_and_ids
from gateway.http.routes import UPLOADS, add_routes
from gateway.metering import tokens
from gateway.metering.auth import Authenticator
from gateway.metering.budget_alerts import BudgetWatch
from gateway.metering.key_store import KeyStore
from gateway.metering.limits import Limiter
from gateway.metering.reports import UsageStore
from gateway.metering.usage import Meter
from gateway.pipeline.cancel import CANCEL_BUS
from gateway.pipeline.checkpoints import Checkpoints
from gateway.reload import COOLDOWN_SYNC
from gateway.routing.router import Router
from gateway.storage.backends import instance_id, make_store
from gateway.tracing import TRACING
from gateway.tracing import start as start_tracing
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.tls import warn_unverified

log = logging.getLogger(__name__)


def _limiter(config: GatewayConfig, usage: UsageStore, watch: BudgetWatch) -> Limiter:
    """Limits in Redis are shared by every replica; else each process keeps its own."""
    if config.limits.redis_url is None:
        return Limiter(usage.spent, watch)
    # Imported only when configured: redis-py is slow to import (cold start).
    from gateway.metering.redis_limits import RedisLimiter

    return RedisLimiter(
        config.limits.redis_url, usage.spent, watch=watch, prefix=config.limits.redis_prefix
    )


def create_app(config: GatewayConfig, *, instance: str | None = None) -> web.Application:
    # The config's secrets are taken out of whatever the app stores or logs from its start on
    # (its store's migrations, its first log line), however it is served.
    scrub.learn(config)
    store = make_store(config.store, instance or instance_id(config.server.port))
    conversations = Conversations(
        store,
        repair_interrupted=config.conversations.repair_interrupted,
        threading=config.conversations.threading,
        session_headers=config.conversations.session_headers,
    )
    keys = KeyStore(store)
    usage = UsageStore(store)
    auth = Authenticator(
        config.auth.master_key, keys, config.auth.key_cache_s, config.auth.key_stale_s
    )
    gateway = Gateway(
        config=config,
        store=store,
        conversations=conversations,
        keys=keys,
        auth=auth,
        usage=usage,
        limiter=_limiter(config, usage, BudgetWatch(config.limits.budget_alerts, store)),
    )
    metrics.STORE_QUEUE.set_function(store.queue_depth)
    metrics.STORE_SPOOL_BYTES.set_function(store.spooled_bytes)
    # Before auth: bodies are timed (408), a declared size over the limit is refused (413).
    limits = request_limits(
        config.server.body_timeout_s, int(config.server.max_upload_mb * 1024 * 1024), UPLOADS
    )
    middlewares = [errors_and_ids, limits, authenticate]
    cors = Cors(config.server.cors_origins) if config.server.cors_origins else None
    if cors is not None:  # preflights are answered before a key is asked for
        middlewares.insert(1, cors.preflight)
    if config.auth.master_key is None:  # open: only this machine's callers (DNS rebinding)
        middlewares.insert(1, HostGuard(config.server.allowed_hosts, cors).check)
    app = web.Application(
        middlewares=middlewares,
        client_max_size=int(config.server.max_body_mb * 1024 * 1024),
    )
    app[GATEWAY] = gateway
    app[FAILED_KEYS] = FailedKeys(config.auth.max_failures, config.auth.failure_window_s)
    if cors is not None:
        app[CORS] = cors
        app.on_response_prepare.append(cors.on_prepare)
    if config.limits.redis_url is not None:
        from gateway.pipeline.cancel_bus import CancelBus

        # A cancel that lands on another replica reaches the one running the turn.
        app[CANCEL_BUS] = CancelBus(config.limits.redis_url, config.limits.redis_prefix, gateway)
    if (tracing := start_tracing(config.tracing)) is not None:  # tracing.otlp_endpoint is set
        app[TRACING] = tracing
    app.cleanup_ctx.extend(_cleanup_contexts())
    app.on_response_prepare.append(add_request_id)
    add_routes(app)
    return app


# One cleanup context per resource, in the order they start: aiohttp closes those that started,
# in reverse, whether the app stops or a later one fails to start.
def _cleanup_contexts() -> list[Callable[[web.Application], AsyncIterator[None]]]:
    return [
        _tracing,
        _limits,
        _store,
        _upstreams,
        _recovery_and_heartbeat,
        _checkpoints,
        _shared_through_redis,
        _tokenizer,
        _background,
    ]


async def _tracing(app: web.Application) -> AsyncIterator[None]:
    yield
    if (tracing := app.get(TRACING)) is not None:
        await tracing.close()  # every turn has ended: their spans are exported now


async def _limits(app: web.Application) -> AsyncIterator[None]:
    yield
    limiter = app[GATEWAY].limiter
    await limiter.close()  # the limits' settles still under way
    if limiter.watch is not None:
        await limiter.watch.close()  # budget notices still being told


async def _store(app: web.Application) -> AsyncIterator[None]:
    store = app[GATEWAY].store
    await store.start()
    yield
    await store.close()


async def _upstreams(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    # One pool for every upstream: kept-alive connections, no per-request TLS handshakes.
    # (It reads SSL_CERT_FILE and SSL_CERT_DIR now, and the router's endpoints their proxies.)
    gateway.upstreams = upstreams = UpstreamPool()
    try:
        gateway.router = Router(gateway.config, upstreams)
        warn_unverified(gateway.router.deployments())  # once each, for `tls.verify: false`
        gateway.meter = Meter(gateway.router.price_of, gateway.usage.write)
    except BaseException:
        await upstreams.close()
        raise
    yield
    await upstreams.close()


async def _recovery_and_heartbeat(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    started = time.time()
    if gateway.store.connected.is_set():
        await gateway.store.heartbeat(started)
        recovered = await recover_open_turns(gateway.store, gateway.meter, at_start=True)
        if recovered:
            log.warning(
                "closed %d turns left open by a previous process (crash_recovered)", recovered
            )
    else:
        # Started during a store outage (serving from the spool): this process's own turns
        # would be indistinguishable from its previous life's by then, so those are closed at
        # its next start; other replicas' are swept by the heartbeat as usual.
        log.warning("store unreachable at start: turns a previous run left open stay open")
    beating = asyncio.create_task(keep_alive(gateway, started), name="store-heartbeat")
    yield
    await _cancelled(beating)


async def _checkpoints(app: web.Application) -> AsyncIterator[None]:
    saving = asyncio.create_task(Checkpoints(app[GATEWAY]).run(), name="checkpoints")
    yield
    await _cancelled(saving)


async def _shared_through_redis(app: web.Application) -> AsyncIterator[None]:
    """With `limits.redis_url`: deployment cooldowns shared by every replica, and cancels that
    reach the replica running the turn."""
    gateway = app[GATEWAY]
    if (redis_url := gateway.config.limits.redis_url) is None:
        yield
        return
    from gateway.routing.cooldowns import CooldownSync

    # A deployment cooling down on one replica is skipped by all of them.
    healths = [d.health for d in gateway.routes.deployments()]
    cooldowns = CooldownSync(redis_url, gateway.config.limits.redis_prefix, healths)
    cooldowns.start()
    app[COOLDOWN_SYNC] = cooldowns  # a reload's deployments are shared from then on
    bus = app[CANCEL_BUS]
    try:
        bus.start()
    except BaseException:
        await cooldowns.close()
        raise
    yield
    await cooldowns.close()
    await bus.close()


async def _tokenizer(app: web.Application) -> AsyncIterator[None]:
    # The tokenizer for estimates is slow to load: in the background from the start, not
    # on the first cancel, and without holding up the first request (cold start).
    warming = asyncio.create_task(asyncio.to_thread(tokens.warm), name="tokenizer-warm")
    yield
    await warming


async def _background(app: web.Application) -> AsyncIterator[None]:
    """What handlers left running (a stream drained after its client left): done before the
    upstreams and the store it needs close."""
    yield
    gateway = app[GATEWAY]
    if gateway.background:
        await asyncio.gather(*gateway.background, return_exceptions=True)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
