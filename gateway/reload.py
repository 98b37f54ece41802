"""SIGHUP: the config file read again, and served from then on.

What a reload changes: the model aliases and their deployments (strategies, retries, cooldowns,
`max_concurrency`, fallbacks), prices (the deployments' own and the price file's) and `auth`
(the master key, the key cache, the failed-key limit). A request that has begun keeps the
objects it began with, so a stream open across a reload ends on the deployment and price it
started with; the next request sees the new ones. The swap is a few attribute assignments with
no await between them: no request sees half of it, and none pays for it.

What needs a restart is kept as it was, and the reload says so: `server`, `store`, `limits`,
`tracing`, `logging`, `conversations`, and turning the master key on or off (which changes the
checks every request goes through).

A file that does not load (bad YAML, a field that fails validation, a deployment name used
twice) changes nothing: the running config stays, and one ERROR line says why, naming the file
and the field as `check-config` does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.context import GATEWAY
from gateway.http.auth_failures import FAILED_KEYS
from gateway.metering.auth import Authenticator
from gateway.metering.usage import Meter
from gateway.routing.router import Deployment, Router
from gateway.upstream.tls import warn_unverified

if TYPE_CHECKING:  # redis-py is slow to import; loaded only with `limits.redis_url`
    from gateway.routing.cooldowns import CooldownSync

log = logging.getLogger("gateway.reload")

COOLDOWN_SYNC: web.AppKey[CooldownSync] = web.AppKey("cooldown_sync")
# Read once, at start: a change to these is reported and waits for a restart.
RESTART_SECTIONS = ("server", "store", "limits", "tracing", "logging", "conversations")


@dataclass(frozen=True)
class Changes:
    """What a reload changed, counted for its log line."""

    aliases: tuple[int, int, int]  # added, removed, changed
    deployments: tuple[int, int, int]
    prices: int  # deployments kept whose price changed
    auth: bool
    kept: tuple[str, ...]  # changed in the file, waiting for a restart

    def summary(self) -> str:
        def counted(what: str, counts: tuple[int, int, int]) -> str:
            added, removed, changed = counts
            return f"{what} {added} added, {removed} removed, {changed} changed"

        parts = [counted("aliases", self.aliases), counted("deployments", self.deployments)]
        parts.append(f"{self.prices} prices changed")
        parts.append("auth changed" if self.auth else "auth unchanged")
        return "; ".join(parts)


def reloadable(old: GatewayConfig, new: GatewayConfig) -> tuple[GatewayConfig, tuple[str, ...]]:
    """`new` with what a reload cannot change taken from `old`, and the names of what the file
    changes there (applied at the next start)."""
    kept = [
        f"{name}.{field}"
        for name in RESTART_SECTIONS
        for field in type(getattr(old, name)).model_fields
        if getattr(getattr(old, name), field) != getattr(getattr(new, name), field)
    ]
    update = {name: getattr(old, name) for name in RESTART_SECTIONS}
    if (old.auth.master_key is None) != (new.auth.master_key is None):
        kept.append("auth.master_key (set or unset)")
        update["auth"] = old.auth
    return new.model_copy(update=update), tuple(kept)


def _counts(old: dict[str, object], new: dict[str, object]) -> tuple[int, int, int]:
    changed = sum(1 for name in old.keys() & new.keys() if old[name] != new[name])
    return len(new.keys() - old.keys()), len(old.keys() - new.keys()), changed


def _by_name(router: Router) -> dict[str, Deployment]:
    return {d.name: d for d in router.deployments()}


def changes(
    old: GatewayConfig,
    new: GatewayConfig,
    old_router: Router,
    router: Router,
    kept: tuple[str, ...],
) -> Changes:
    before, after = _by_name(old_router), _by_name(router)
    return Changes(
        aliases=_counts({m.name: m for m in old.models}, {m.name: m for m in new.models}),
        deployments=_counts(
            {n: (d.alias, d.config) for n, d in before.items()},
            {n: (d.alias, d.config) for n, d in after.items()},
        ),
        prices=sum(1 for n in before.keys() & after.keys() if before[n].price != after[n].price),
        auth=old.auth != new.auth,
        kept=kept,
    )


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class Reloader:
    """Reloads the app's config when asked (SIGHUP), one reload at a time: asked again during
    one, it reloads once more after it, so the file's last state is what is served."""

    def __init__(self, app: web.Application, path: Path | None) -> None:
        self._app = app
        self._path = path
        self._wanted = asyncio.Event()

    def request(self) -> None:
        self._wanted.set()

    async def run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.reload()

    async def reload(self) -> bool:
        """Read the file again and serve it; False (the running config kept) when it cannot
        be used."""
        where = str(self._path) if self._path is not None else "the config"
        try:
            loaded = await asyncio.to_thread(load_config, self._path)
        except ConfigError as exc:
            log.error(
                "config reload failed, still serving the previous config: %s", _one_line(str(exc))
            )
            return False
        gateway = self._app[GATEWAY]
        old, old_router = gateway.config, gateway.routes
        config, kept = reloadable(old, loaded.config)
        assert gateway.upstreams is not None, "the app has started"
        try:
            healths = {d.name: d.health for d in old_router.deployments()}
            router = Router(config, gateway.upstreams, healths=healths)
        except Exception as exc:
            log.error(
                "config reload failed, still serving the previous config: %s: %s",
                where,
                _one_line(str(exc)) or type(exc).__name__,
            )
            return False
        for warning in loaded.warnings:
            log.warning("%s", warning)
        warn_unverified(router.deployments())
        auth = gateway.auth
        keys_read = ("master_key", "key_cache_s", "key_stale_s")  # what the authenticator holds
        if any(getattr(config.auth, f) != getattr(old.auth, f) for f in keys_read):
            auth = Authenticator(
                config.auth.master_key,
                gateway.keys,
                config.auth.key_cache_s,
                config.auth.key_stale_s,
            )
        # One step, no await: every request from here on sees the new config whole.
        gateway.config = config
        gateway.router = router
        meter = gateway.meter
        gateway.meter = (
            meter.repriced(router.price_of)
            if meter is not None
            else Meter(router.price_of, gateway.usage.write)
        )
        gateway.auth = auth
        failed = self._app[FAILED_KEYS]
        failed.max_failures, failed.window_s = (
            config.auth.max_failures,
            config.auth.failure_window_s,
        )
        if (sync := self._app.get(COOLDOWN_SYNC)) is not None:
            sync.track(d.health for d in router.deployments())
        summary = changes(old, config, old_router, router, kept).summary()
        log.info("config reloaded from %s: %s", where, summary)
        if kept:
            log.warning(
                "config reload: %s changed in %s, kept as it was until the next start",
                ", ".join(kept),
                where,
            )
        return True
