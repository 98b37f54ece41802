"""Teams, virtual keys and the principal a request acts as.

A virtual key (`gw-` + 43 random characters) is shown once, when it is created; the store keeps
only its SHA-256. Keys are high-entropy, so a fast hash is enough: there is nothing to guess.
Every key belongs to a team and sees only that team's conversations; the master key (admin)
sees everything. Without a master key the gateway runs open, and every caller is admin.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

KEY_PREFIX = "gw-"


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Team:
    id: str
    name: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] | None = None  # gateway.metering.limits.Limits, as stored

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "team",
            "name": self.name,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "limits": self.limits,
        }


@dataclass(frozen=True)
class KeyRecord:
    id: str
    hash: str
    prefix: str  # the first characters of the secret, to recognise it in lists
    team_id: str
    created_at: float
    name: str | None = None
    user: str | None = None
    models: tuple[str, ...] | None = None  # allowed aliases; None: all
    expires_at: float | None = None
    revoked_at: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] | None = None

    def unusable_because(self, now: float | None = None) -> str | None:
        now = time.time() if now is None else now
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return None

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "key",
            "name": self.name,
            "key_prefix": self.prefix,
            "team_id": self.team_id,
            "user": self.user,
            "models": list(self.models) if self.models is not None else None,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "limits": self.limits,
        }


@dataclass(frozen=True)
class Principal:
    kind: Literal["admin", "key", "open"]
    team_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    models: frozenset[str] | None = None
    key_limits: dict[str, Any] | None = None
    team_limits: dict[str, Any] | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind != "key"

    def may_use(self, model: str, alias: str | None = None) -> bool:
        """Whether the key may ask for `model`, served by the configured `alias` (a pattern
        alias's own name, `openai/*`, allows every id it serves)."""
        models = self.models
        return models is None or model in models or (alias is not None and alias in models)

    def sees(self, team_id: str | None) -> bool:
        return self.is_admin or (team_id is not None and team_id == self.team_id)


ADMIN = Principal("admin")
OPEN = Principal("open")
