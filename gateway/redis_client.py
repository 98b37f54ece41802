"""The Redis client every replica shares state through (`limits.redis_url`), and its error metric.

Timeouts are short and there is one immediate retry (a pooled connection that Redis closed is
reopened once): callers on the request path fall back to local state rather than wait on Redis.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway import metrics

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5

# What a failing Redis call may raise: redis-py wraps socket errors, but not always.
ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

REDIS_ERRORS = Counter(
    "gateway_redis_errors_total",
    "Redis calls that failed, by operation (admit, settle, refresh, probe, cooldown_publish,"
    " cooldown_clear, cooldown_poll, cancel_publish, cancel_listen).",
    ["operation"],
    registry=metrics.REGISTRY,
)
# At 0 from the start, so that the first failures are an increase to the alert rule
# (deploy/alerts.yml) rather than a new series.
OPERATIONS = (
    "admit",
    "settle",
    "refresh",
    "probe",
    "cooldown_publish",
    "cooldown_clear",
    "cooldown_poll",
    "cancel_publish",
    "cancel_listen",
)
for _operation in OPERATIONS:
    REDIS_ERRORS.labels(_operation)


def connect(url: str, timeout_s: float = TIMEOUT_S) -> Redis:
    """A client for `url` (redis://, rediss:// or unix://); it connects on first use."""
    client: Redis = Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
    )
    return client
