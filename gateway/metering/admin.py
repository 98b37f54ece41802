"""Admin operations on teams and keys, shared by the HTTP admin API and the CLI."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.ids import new_id
from gateway.metering.auth import Authenticator
from gateway.metering.key_store import KeyStore
from gateway.metering.keys import KeyRecord, Team, generate_key, hash_key
from gateway.metering.limits import Limits

ROTATE_OVERLAP_S = 3600.0
_TEAM_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class NewTeam(_Request):
    name: str = Field(min_length=1, max_length=200)
    id: str | None = Field(None, description="Defaults to a generated `team_...` id.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    limits: Limits | None = None


class TeamChanges(_Request):
    name: str | None = Field(None, min_length=1, max_length=200)
    limits: Limits | None = None


class NewKey(_Request):
    team_id: str
    name: str | None = None
    user: str | None = None
    models: list[str] | None = Field(None, description="Allowed model aliases; all when absent.")
    expires_at: float | None = Field(None, description="Unix time after which the key fails.")
    expires_in_s: float | None = Field(None, gt=0, description="Or: seconds from now.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    limits: Limits | None = None


class KeyChanges(_Request):
    name: str | None = None
    user: str | None = None
    models: list[str] | None = None
    expires_at: float | None = None
    metadata: dict[str, Any] | None = None
    limits: Limits | None = None


class KeyRotation(_Request):
    overlap_s: float = Field(
        3600, ge=0, description="How long the old key keeps working (default one hour)."
    )


@dataclass(frozen=True)
class RotatedKey:
    key: KeyRecord  # the new one
    secret: str
    old: KeyRecord  # with the expiry the overlap gave it


class Admin:
    def __init__(self, keys: KeyStore, auth: Authenticator, known: Callable[[str], bool]) -> None:
        self._keys = keys
        self._auth = auth
        self._known = known  # whether a model id is served: an alias, or a pattern's

    async def create_team(self, request: NewTeam) -> Team:
        team_id = request.id or new_id("team")
        if not _TEAM_ID.match(team_id):
            raise InvalidRequest("'id' must be 1-64 letters, digits, '.', '_' or '-'.", param="id")
        limits = request.limits.model_dump(exclude_none=True) if request.limits else None
        team = Team(team_id, request.name, time.time(), request.metadata, limits)
        if not await self._keys.create_team(team):
            raise Conflict(f"A team with id '{team_id}' exists already.", code="team_exists")
        return team

    async def create_key(self, request: NewKey) -> tuple[KeyRecord, str]:
        if await self._keys.team(request.team_id) is None:
            raise InvalidRequest(f"No team with id '{request.team_id}'.", param="team_id")
        self._check_models(request.models)
        expires_at = request.expires_at
        if request.expires_in_s is not None:
            expires_at = time.time() + request.expires_in_s
        secret = generate_key()
        record = KeyRecord(
            id=new_id("key"),
            hash=hash_key(secret),
            prefix=secret[:7],
            team_id=request.team_id,
            created_at=time.time(),
            name=request.name,
            user=request.user,
            models=tuple(request.models) if request.models is not None else None,
            expires_at=expires_at,
            metadata=request.metadata,
            limits=request.limits.model_dump(exclude_none=True) if request.limits else None,
        )
        await self._keys.create_key(record)
        return record, secret

    async def key(self, key_id: str) -> KeyRecord:
        record = await self._keys.key(key_id)
        if record is None:
            raise NotFound(f"No key with id '{key_id}'.")
        return record

    async def update_key(self, key_id: str, request: KeyChanges) -> KeyRecord:
        changes = request.model_dump(exclude_unset=True, exclude_none=False)
        if request.limits is not None:
            changes["limits"] = request.limits.model_dump(exclude_none=True)
        self._check_models(changes.get("models"))
        record = await self._keys.update_key(key_id, changes)
        if record is None:
            raise NotFound(f"No key with id '{key_id}'.")
        self._auth.forget(record.hash)
        return record

    async def revoke_key(self, key_id: str) -> KeyRecord:
        record = await self.key(key_id)
        if record.revoked_at is None:
            record = await self._keys.update_key(key_id, {"revoked_at": time.time()}) or record
        self._auth.forget(record.hash)
        return record

    async def update_team(self, team_id: str, request: TeamChanges) -> Team:
        if request.name is not None and await self._keys.team(team_id) is not None:
            await self._keys.rename_team(team_id, request.name)
        if "limits" not in request.model_fields_set:
            team = await self._keys.team(team_id)
        else:
            limits = request.limits.model_dump(exclude_none=True) if request.limits else None
            team = await self._keys.update_team_limits(team_id, limits)
        if team is None:
            raise NotFound(f"No team with id '{team_id}'.")
        self._auth.forget_team(team_id)
        return team

    async def delete_team(self, team_id: str, *, revoke_keys: bool = False) -> list[KeyRecord]:
        """Delete a team; its keys still usable refuse it (409) unless `revoke_keys`, which
        revokes them first. The keys revoked. Its conversations and usage stay, under its id."""
        if await self._keys.team(team_id) is None:
            raise NotFound(f"No team with id '{team_id}'.")
        usable = [k for k in await self._keys.keys(team_id) if k.unusable_because() is None]
        if usable and not revoke_keys:
            raise Conflict(
                f"Team '{team_id}' has {len(usable)} usable keys: revoke them first.",
                code="team_has_keys",
            )
        revoked = [await self.revoke_key(k.id) for k in usable]
        await self._keys.delete_team(team_id)
        self._auth.forget_team(team_id)
        return revoked

    async def rotate_key(self, key_id: str, overlap_s: float = ROTATE_OVERLAP_S) -> RotatedKey:
        """A new key like this one (team, name, user, models, expiry, metadata, limits); the
        old one keeps working for `overlap_s` more (never longer than it would have), so its
        clients can move over, then expires."""
        old = await self.key(key_id)
        reason = old.unusable_because()
        if reason is not None:
            raise Conflict(f"Key '{key_id}' is {reason}: nothing to rotate.", code=f"key_{reason}")
        secret = generate_key()
        new = replace(
            old,
            id=new_id("key"),
            hash=hash_key(secret),
            prefix=secret[:7],
            created_at=time.time(),
            revoked_at=None,
        )
        await self._keys.create_key(new)
        until = time.time() + overlap_s
        if old.expires_at is None or until < old.expires_at:
            old = await self._keys.update_key(key_id, {"expires_at": until}) or old
        self._auth.forget(old.hash)
        return RotatedKey(new, secret, old)

    def _check_models(self, models: list[str] | None) -> None:
        unknown = [m for m in models or () if not self._known(m)]
        if unknown:
            raise InvalidRequest(f"Unknown model aliases: {', '.join(unknown)}.", param="models")
