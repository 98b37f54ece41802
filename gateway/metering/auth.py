"""Authentication: the key a request carries, resolved to the principal it acts as.

`Authorization: Bearer <key>` or `x-api-key: <key>`. The master key is the admin. A virtual key
(`gw-...`) is looked up by its hash; lookups are cached for `auth.key_cache_s`, and a key changed
through this process is forgotten at once. While the store cannot be read, a key looked up
before keeps working from the cache for `auth.key_stale_s` more (stale-while-error; a key not
cached gets 503 `store_unavailable`), and is checked again as soon as the store answers.
Without a master key the gateway runs open: a request without a valid virtual key acts as the
admin (local use only).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping

from gateway.errors import Unauthorized
from gateway.metering.key_store import KeyStore
from gateway.metering.keys import ADMIN, KEY_PREFIX, OPEN, KeyRecord, Principal, Team, hash_key
from gateway.storage.db import StoreUnavailable

_CACHE_MAX = 10_000
_STORE_RETRY_S = 1.0  # during an outage, how often a lookup asks the store again


def well_formed(secret: str) -> bool:
    """Whether a presented key can be a key at all: printable characters only. A header value
    with bytes that are not UTF-8 arrives with lone surrogates (aiohttp decodes it with
    `surrogateescape`), which no hash can take; control characters are no key's either."""
    return secret.isprintable()


def presented_key(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key") or None


class Authenticator:
    def __init__(
        self, master_key: str | None, keys: KeyStore, cache_s: float, stale_s: float = 900.0
    ) -> None:
        self.open = master_key is None
        self._master_hash = hash_key(master_key) if master_key else None
        self._keys = keys
        self._cache_s = cache_s
        self._stale_s = stale_s  # past its expiry, a cached entry still serves a store outage
        # Until when a stale entry is served without asking the store again: a store that
        # hangs (a partition, not a refusal) costs one lookup's timeout a second, not one a
        # request.
        self._store_down_until = 0.0
        # By key hash: its record (None: no such key) and the principal made of it and its
        # team, the same object every request while cached.
        self._cache: dict[str, tuple[float, KeyRecord | None, Principal | None]] = {}
        self._teams: dict[str, tuple[float, Team | None]] = {}

    async def principal(self, headers: Mapping[str, str]) -> Principal:
        secret = presented_key(headers)
        if secret is None:
            if self.open:
                return OPEN
            raise Unauthorized(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
            )
        if not well_formed(secret):
            # Never echoed nor logged: a 401 like any wrong key's, whatever the mode.
            raise Unauthorized(
                "The API key is malformed: it must be printable UTF-8 text.",
                code="invalid_api_key",
            )
        key_hash = hash_key(secret)
        if self._master_hash is not None and hmac.compare_digest(key_hash, self._master_hash):
            return ADMIN
        if not secret.startswith(KEY_PREFIX):
            if self.open:
                return OPEN  # any SDK placeholder key works locally
            raise Unauthorized("Incorrect API key provided.")
        record, principal = await self._lookup(key_hash)
        if record is None or principal is None:
            raise Unauthorized("Incorrect API key provided.")
        reason = record.unusable_because()  # every time: a key expires at its time, cached or not
        if reason is not None:
            raise Unauthorized(f"This API key has been {reason}.", code=f"api_key_{reason}")
        return principal

    async def _principal_of(self, record: KeyRecord) -> Principal:
        models = frozenset(record.models) if record.models is not None else None
        team = await self._team(record.team_id)
        return Principal(
            "key",
            record.team_id,
            record.id,
            record.user,
            models,
            key_limits=record.limits,
            team_limits=team.limits if team is not None else None,
        )

    async def _team(self, team_id: str) -> Team | None:
        now = time.monotonic()
        cached = self._teams.get(team_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            team = await self._keys.team(team_id)
        except StoreUnavailable:
            if cached is not None and cached[0] + self._stale_s > now:
                return cached[1]
            raise
        self._teams[team_id] = (now + self._cache_s, team)
        return team

    def forget_team(self, team_id: str) -> None:
        self._teams.pop(team_id, None)
        # Its keys' principals carry its limits.
        self._cache = {
            h: c for h, c in self._cache.items() if c[2] is None or c[2].team_id != team_id
        }

    async def _lookup(self, key_hash: str) -> tuple[KeyRecord | None, Principal | None]:
        now = time.monotonic()
        cached = self._cache.get(key_hash)
        if cached is not None and (
            cached[0] > now or (now < self._store_down_until and cached[0] + self._stale_s > now)
        ):
            return cached[1], cached[2]
        try:
            record = await self._keys.key_by_hash(key_hash)
            principal = await self._principal_of(record) if record is not None else None
        except StoreUnavailable:
            # Stale-while-error: the last answer, for a bounded time; not cached again, so the
            # first lookup after the store returns sees a revocation made meanwhile.
            self._store_down_until = time.monotonic() + _STORE_RETRY_S
            if cached is not None and cached[0] + self._stale_s > now:
                return cached[1], cached[2]
            raise
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key_hash] = (now + self._cache_s, record, principal)
        return record, principal

    def forget(self, key_hash: str) -> None:
        self._cache.pop(key_hash, None)
