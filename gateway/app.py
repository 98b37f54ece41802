"""create_app(config): wiring only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.context import GATEWAY, Gateway
from gateway.conversations.recovery import PeerWatch, recover_open_turns
from gateway.conversations.service import Conversations
from gateway.http.auth import authenticate
from gateway.http.auth_failures import FAILED_KEYS, FailedKeys
from gateway.http.conversations import CANCEL_BUS
from gateway.http.cors import CORS, Cors
from gateway.http.host_guard import HostGuard
from gateway.http.middleware import add_request_id, errors_and_ids
from gateway.http.routes import UPLOADS, add_routes
from gateway.http.slow_clients import request_limits
from gateway.metering import tokens
from gateway.metering.auth import Authenticator
from gateway.metering.budget_alerts import BudgetWatch
from gateway.metering.key_store import KeyStore
from gateway.metering.limits import Limiter
from gateway.metering.reports import UsageStore
from gateway.metering.usage import Meter
from gateway.pipeline.checkpoints import Checkpoints
from gateway.reload import COOLDOWN_SYNC
from gateway.routing.router import Router
from gateway.storage.backends import instance_id, make_store
from gateway.storage.db import StoreUnavailable
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
    app.cleanup_ctx.append(_resources)
    app.on_response_prepare.append(add_request_id)
    add_routes(app)
    return app


async def _resources(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    await gateway.store.start()
    started = time.time()
    # One pool for every upstream: kept-alive connections, no per-request TLS handshakes.
    # (It reads SSL_CERT_FILE and SSL_CERT_DIR now, and the router's endpoints their proxies.)
    gateway.upstreams = UpstreamPool()
    gateway.router = Router(gateway.config, gateway.upstreams)
    warn_unverified(gateway.router.deployments())  # once each, for `tls.verify: false`
    gateway.meter = Meter(gateway.router.price_of, gateway.usage.write)
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
        # its next start; other replicas' are swept by the heartbeat below as usual.
        log.warning("store unreachable at start: turns a previous run left open stay open")
    keeper = asyncio.create_task(_keep_alive(gateway, started), name="store-heartbeat")
    checkpoints = asyncio.create_task(Checkpoints(gateway).run(), name="checkpoints")
    cooldowns = None
    if (redis_url := gateway.config.limits.redis_url) is not None:
        from gateway.routing.cooldowns import CooldownSync

        # A deployment cooling down on one replica is skipped by all of them.
        healths = [d.health for d in gateway.router.deployments()]
        cooldowns = CooldownSync(redis_url, gateway.config.limits.redis_prefix, healths)
        cooldowns.start()
        app[COOLDOWN_SYNC] = cooldowns  # a reload's deployments are shared from then on
        app[CANCEL_BUS].start()
    # The tokenizer for estimates is slow to load: in the background from the start, not
    # on the first cancel, and without holding up the first request (cold start).
    warming = asyncio.create_task(asyncio.to_thread(tokens.warm), name="tokenizer-warm")
    yield
    await warming
    keeper.cancel()
    checkpoints.cancel()
    if gateway.background:
        await asyncio.gather(*gateway.background, return_exceptions=True)
    await gateway.upstreams.close()
    await gateway.store.close()
    if cooldowns is not None:
        await cooldowns.close()
        await app[CANCEL_BUS].close()
    await gateway.limiter.close()  # the limits' settles still under way
    if gateway.limiter.watch is not None:
        await gateway.limiter.watch.close()  # budget notices still being told
    if (tracing := app.get(TRACING)) is not None:
        await tracing.close()  # every turn has ended: their spans are exported now


async def _keep_alive(gateway: Gateway, started: float) -> None:
    """Heartbeat, and close the open turns of replicas that died and did not come back.

    A replica is taken for dead two heartbeats after its last, and the sweep runs at every
    beat: its turns are closed within `store.recovery_s` of its death. Two beats this replica
    made: after an outage of the store, the others get that long to beat again (PeerWatch)."""
    beat_s = gateway.config.store.recovery_s / 3
    watch = PeerWatch(beat_s)
    failing = False  # said once when the beats start failing, once when they come back
    while True:
        await asyncio.sleep(beat_s)
        try:
            await gateway.store.heartbeat(started)
            if failing:
                failing = False
                log.info("store heartbeat succeeds again")
            if not watch.beat(time.time()):
                continue
            recovered = await recover_open_turns(
                gateway.store, gateway.meter, at_start=False, stale_s=watch.stale_s
            )
            watch.reached(time.time())
            if recovered:
                log.warning("closed %d turns of a stopped replica (crash_recovered)", recovered)
        except Exception as exc:
            # A store outage, not a bug: the writes go to the spool, which says so itself.
            watch.missed()
            reason = str(exc) if isinstance(exc, StoreUnavailable) else repr(exc)
            if failing:
                log.debug("store heartbeat failed again: %s", reason)
            else:
                failing = True
                log.warning(
                    "store heartbeat failed: %s (not logged again until it succeeds)", reason
                )
            log.debug("store heartbeat failure", exc_info=True)
