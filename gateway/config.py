"""Configuration: YAML file -> pydantic models that forbid unknown fields.

`${VAR}` anywhere in a string pulls the value from the environment (`${VAR:-default}` gives a
default). A bad file fails at start with the file, the field path and the reason
(`ConfigError`). Secrets stay references in the file; the loaded value lives only in memory.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.metering.price_file import load_price_file
from gateway.providers import cloud, extras
from gateway.upstream.proxy import DIRECT, Proxy
from gateway.upstream.tls import TrustError, check_bundle, environment_trust
from gateway.url_check import check_url

DEFAULT_CONFIG_PATH = Path("config/gateway.yaml")

_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file, field and reason."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Model):
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(4000, ge=0, le=65535, description="TCP port to listen on (0 picks one).")
    max_body_mb: float = Field(
        16, gt=0, description="Largest accepted request body, in MiB; larger gets 413."
    )
    max_upload_mb: float = Field(
        100,
        gt=0,
        description="Largest multipart form (file uploads, audio to transcribe, images to edit),"
        " in MiB; larger gets 413.",
    )
    large_body_kb: int = Field(
        1024,
        ge=1,
        description="A completion or embeddings body of this many KiB or more is large: parsed"
        " off the event loop, and handled at most `large_bodies_per_key` at once per key (more"
        " wait their turn).",
    )
    large_bodies_per_key: int = Field(
        1, ge=1, description="Large request bodies of one key started at once; more wait."
    )
    large_body_hold_s: float = Field(
        10,
        gt=0,
        description="How long a large request keeps its place among its key's"
        " `large_bodies_per_key` at most: its start, not its whole answer.",
    )
    max_messages: int = Field(
        10_000, ge=1, description="Most messages a completion request may carry; more gets 413."
    )
    max_message_parts: int = Field(
        1_000, ge=1, description="Most content parts one message may have; more gets 413."
    )
    max_tools: int = Field(
        512, ge=1, description="Most tools a completion request may offer; more gets 413."
    )
    shutdown_grace_s: float = Field(
        10, ge=0, description="How long in-flight streams may finish after SIGTERM."
    )
    header_timeout_s: float = Field(
        10,
        gt=0,
        description="A request head (request line and headers) must arrive whole within this"
        " long of its first byte (of the connection, for the first request); else the"
        " connection is closed (slowloris).",
    )
    body_timeout_s: float = Field(
        60, gt=0, description="A request body must arrive whole within this long; else 408."
    )
    client_idle_timeout_s: float | None = Field(
        30,
        gt=0,
        description="A stream whose client acknowledges nothing for this long while the gateway"
        " has sent it more (it stopped reading without closing) is reset and recorded as"
        " interrupted at what it was delivered, reason `client_idle`. null: no limit.",
    )
    tell_clients_not_to_retry: bool = Field(
        True,
        description="An error answered after the gateway's own retries says `x-should-retry:"
        " false`, so the client's SDK does not retry it again on top of them.",
    )
    keepalive_timeout_s: float = Field(
        60,
        gt=0,
        description="A kept-alive client connection with no request under way is closed after"
        " this long idle.",
    )
    max_connections: int = Field(
        10_000,
        ge=1,
        description="Open client connections at most; a connection beyond them gets 503 for its"
        " request (`/health/live` is still answered) and is closed.",
    )
    cors_origins: list[str] | Literal["*"] | None = Field(
        None,
        description="Origins whose browser pages may call the API (`https://app.example.com`,"
        " `http://localhost:5173`), or `*` for any: their preflights are answered without a"
        " key and their answers carry `Access-Control-Allow-Origin`. Unset: no CORS headers.",
    )

    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Without a master key, the host names (or addresses) requests may be"
        " addressed to besides localhost, 127.0.0.1 and [::1] (`Host`, any port), and whose"
        " pages may make changes (`Origin`): `gateway.lan`, `192.168.1.20`. Any other is"
        " refused (403 `host_not_allowed`), against DNS rebinding. Unused with a master key.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            bracketed = name.startswith("[") and name.endswith("]")
            if not name or any(c in name for c in "/@ ") or (":" in name and not bracketed):
                raise ValueError(
                    f"{name!r} is not a host name: write the name or address alone, without"
                    " scheme or port (`gateway.lan`, `192.168.1.20`, `[fd00::1]`)"
                )
        return value

    @field_validator("cors_origins")
    @classmethod
    def _exact_origins(cls, value: list[str] | str | None) -> list[str] | str | None:
        if not isinstance(value, list):
            return value
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port], with no path"
                    " and no trailing slash (`http://localhost:5173`), or `*` for any"
                )
        return value


class StoreConfig(_Model):
    url: str = Field(
        "sqlite:///data/gateway.db",
        description="Conversation store. `sqlite:///relative/path.db`, `sqlite:////abs.db`, or"
        " `postgresql://user:password@host:port/db` (several replicas share one PostgreSQL).",
    )
    search_timeout_s: float = Field(
        5,
        gt=0,
        description="How long a conversation list or search (`GET /v1/conversations`) may take,"
        " waiting for its turn included; past it the query is stopped and answered 503"
        " `search_timeout`. A key runs one search at a time.",
    )
    migrate_on_start: bool = Field(
        True,
        description="Apply pending schema migrations at start (else run `gateway migrate`"
        " first; a store behind its migrations refuses to start).",
    )
    queue_max: int = Field(
        10_000,
        ge=1,
        description="Writes waiting for the store before new ones spill to the spool file.",
    )
    spool_path: str = Field(
        "data/spool",
        description="Directory of the append-only spool that keeps writes while the store is"
        " down or slow; they are replayed in order, once, when it returns.",
    )
    pool_size: int = Field(10, ge=1, description="PostgreSQL connections per process.")
    recovery_s: float = Field(
        15,
        ge=3,
        description="A replica that stops heartbeating (killed, its host lost) has its open"
        " turns closed by another replica within this long, with what their clients had been"
        " delivered; the same instance closes its own at restart.",
    )
    journal: bool | None = Field(
        None,
        description="Make a turn durable before its client sees the end by appending its writes"
        " to a journal in `spool_path` (one write() each, as durable as a SQLite commit), so"
        " the database commits many turns at a time; else wait for the commit. Default: on"
        " for SQLite, off for PostgreSQL (whose commit is durable on the server).",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("use sqlite:///PATH or postgresql://user:password@host:port/db")
        if not value.startswith("sqlite:"):
            # No host: libpq's default, the local socket (or `?host=/run/postgresql`).
            check_url(
                value,
                ("postgresql", "postgres"),
                "postgresql://user:password@host:5432/db",
                host_required=False,
                many_hosts=True,
            )
        return value

    @property
    def backend(self) -> str:
        return "sqlite" if self.url.startswith("sqlite:") else "postgresql"

    @property
    def sqlite_path(self) -> Path:
        return Path(self.url.removeprefix("sqlite:///"))


class BudgetAlertsConfig(_Model):
    thresholds: list[float] = Field(
        [0.8, 1.0],
        description="Shares of a budget whose passing is told once a period (1.0: spent, or a"
        " request refused by a hard budget).",
    )
    webhook_url: str | None = Field(
        None, description="Where each notice is POSTed as JSON. Unset: notices are only logged."
    )
    webhook_secret: str | None = Field(
        None,
        description="Signs each notice: HMAC-SHA256 of the body, hex, in X-Gateway-Signature.",
    )

    @field_validator("thresholds")
    @classmethod
    def _shares(cls, value: list[float]) -> list[float]:
        if any(not 0 < share <= 10 for share in value):
            raise ValueError("each threshold is a share of the budget, above 0 and at most 10")
        return sorted(set(value))

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        check_url(value, ("http", "https"), "https://hooks.example.com/budget")
        return value

    @model_validator(mode="after")
    def _signed(self) -> BudgetAlertsConfig:
        if self.webhook_url and not self.webhook_secret:
            raise ValueError("webhook_url needs webhook_secret, which signs every notice")
        return self


class LimitsConfig(_Model):
    redis_url: str | None = Field(
        None,
        description="Redis shared by every replica for rate-limit windows, budget reservations"
        " and deployment cooldowns (`redis://host:6379/0`). Unset: each process keeps its own.",
    )
    redis_prefix: str = Field("gw:", description="Prefix of every Redis key the gateway writes.")
    end_user_header: str | None = Field(
        None,
        description="A request header naming the end user when neither the key nor the"
        " request's `user` does: whom `end_user` limits and the usage records count.",
    )
    budget_alerts: BudgetAlertsConfig = Field(default_factory=BudgetAlertsConfig)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if not value:
            return None  # an unset ${VAR}: no Redis, with the warning about the variable
        example = "redis://host:6379/0"
        if value.startswith("unix://"):
            if not value.removeprefix("unix://").startswith("/"):
                raise ValueError("a unix:// URL needs the socket's absolute path: unix:///path")
            return value
        check_url(value, ("redis", "rediss", "unix"), example)
        database = value.partition("://")[2].partition("/")[2].partition("?")[0]
        if database and not database.isdigit():
            raise ValueError(f"the database after the host must be a number (e.g. {example})")
        return value


class TimeoutsConfig(_Model):
    connect_s: float = Field(10, gt=0, description="Opening the TCP/TLS connection.")
    first_token_s: float = Field(
        120, gt=0, description="From sending the request to the first content chunk."
    )
    idle_s: float = Field(120, gt=0, description="Longest gap between two upstream chunks.")
    total_s: float = Field(900, gt=0, description="Whole upstream request, streaming included.")


class TLSConfig(_Model):
    ca_bundle: str | None = Field(
        None,
        description="PEM file of the CAs this deployment's upstream certificate is checked"
        " against, instead of the system's (and SSL_CERT_FILE's). A file that is missing or"
        " holds no certificate is a config error.",
    )
    verify: bool = Field(
        True,
        description="Check the upstream's certificate and host name. `false` checks nothing"
        " (anyone on the path can read the traffic); a warning at start names the deployment.",
    )

    @field_validator("ca_bundle")
    @classmethod
    def _readable_bundle(cls, value: str | None) -> str | None:
        if value is not None:
            check_bundle(value)
        return value


class DeploymentPrice(_Model):
    """A deployment's own price, in litellm's fields (USD per token); it replaces the price
    file's and the bundled map's whole."""

    input_cost_per_token: float = Field(ge=0, description="USD per prompt token.")
    output_cost_per_token: float = Field(
        ge=0, description="USD per completion token (reasoning tokens included)."
    )
    cache_read_input_token_cost: float | None = Field(
        None, ge=0, description="USD per prompt token read from the cache (default: input)."
    )
    cache_creation_input_token_cost: float | None = Field(
        None,
        ge=0,
        description="USD per prompt token written to the cache, 5-minute (default: input).",
    )
    cache_creation_input_token_cost_above_1hr: float | None = Field(
        None,
        ge=0,
        description="USD per prompt token written to the 1-hour cache (default: the 5-minute).",
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="The model's largest answer, in tokens."
    )
    # The units of the API calls that are not chats (gateway.metering.call_prices).
    input_cost_per_image: float | None = Field(
        None, ge=0, description="USD per image generated (images endpoints)."
    )
    input_cost_per_second: float | None = Field(
        None, ge=0, description="USD per second of audio transcribed or translated."
    )
    output_cost_per_second: float | None = Field(
        None, ge=0, description="USD per second of speech generated."
    )
    input_cost_per_character: float | None = Field(
        None, ge=0, description="USD per character of text spoken (audio speech)."
    )
    input_cost_per_query: float | None = Field(
        None, ge=0, description="USD per search (rerank; 100 documents a search)."
    )
    input_cost_per_token_batches: float | None = Field(
        None, ge=0, description="USD per prompt token of a batch (default: input)."
    )
    output_cost_per_token_batches: float | None = Field(
        None, ge=0, description="USD per completion token of a batch (default: output)."
    )


class DeploymentConfig(_Model):
    provider: Literal["openai", "azure", "anthropic", "litellm", "demo"] = Field(
        description="`openai`: any OpenAI-compatible endpoint; `azure`: Azure OpenAI;"
        " `anthropic`: the Messages API; `litellm`: any provider litellm knows;"
        " `demo`: built-in, no key needed."
    )
    model: str | None = Field(None, description="The upstream's model id (defaults to the alias).")
    api_base: str | None = Field(None, description="Base URL, e.g. https://api.openai.com/v1.")
    api_key: str | None = Field(None, description="Upstream key; write it as ${ENV_VAR}.")
    name: str | None = Field(None, description="Deployment name in records and headers.")
    api_version: str = Field(
        "2024-10-21", description="`azure` only: the `api-version` query parameter."
    )
    api: Literal["chat_completions", "responses"] = Field(
        "chat_completions",
        description="`openai` only: the upstream API to call; `responses` sends every request"
        " to its native `/responses` endpoint (with the history as input, `store: false`).",
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    chunk_delay_ms: float = Field(
        50, ge=0, description="`demo` only: pause between streamed chunks (about 20 a second)."
    )
    extra_headers: dict[str, str] = Field(
        default_factory=dict, description="Headers added to every upstream request."
    )
    proxy: str | None = Field(
        None,
        description="HTTP proxy to the upstream: `http://[user:password@]host:port`, or `none`"
        " (also `null`) to connect directly. Unset: from the environment (`HTTPS_PROXY`,"
        " `HTTP_PROXY`, `NO_PROXY`, lower-case too), as curl reads them. Not for `litellm`.",
    )
    tls: TLSConfig = Field(
        default_factory=TLSConfig,
        description="How the upstream's certificate is checked. Not for `litellm`.",
    )
    weight: float = Field(1, gt=0, description="Share of traffic under the `weighted` strategy.")
    priority: int = Field(
        0, description="Lower goes first under the `fallback` strategy (ties keep file order)."
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="Requests in flight at most; a full deployment is skipped."
    )
    input_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens (the `cost` strategy)."
    )
    output_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million completion tokens (the `cost` strategy)."
    )
    price: Literal["free"] | DeploymentPrice | None = Field(
        None,
        description="This deployment's price, over the price file's and the bundled map's:"
        " `free` (metered at 0, admitted under a hard budget), or litellm's price fields.",
    )

    # Cloud settings, `litellm` only (gateway.providers.cloud): passed with each call, so that
    # deployments of one alias can be in different regions, accounts and projects.
    aws_region: str | None = Field(
        None, description="`bedrock/...`, `sagemaker/...`: the AWS region (`eu-west-1`)."
    )
    aws_access_key_id: str | None = Field(
        None, description="AWS access key id; write it as ${ENV_VAR}. Unset: AWS's own chain."
    )
    aws_secret_access_key: str | None = Field(
        None, description="AWS secret access key, with `aws_access_key_id`; as ${ENV_VAR}."
    )
    aws_session_token: str | None = Field(
        None, description="AWS session token of temporary keys, with the two above."
    )
    aws_profile: str | None = Field(
        None, description="A profile of the AWS config files, instead of the access keys."
    )
    vertex_project: str | None = Field(
        None, description="`vertex_ai/...`: the Google Cloud project id."
    )
    vertex_location: str | None = Field(
        None, description="`vertex_ai/...`: the region (`us-central1`, `europe-west4`, `global`)."
    )
    vertex_credentials: str | None = Field(
        None,
        description="`vertex_ai/...`: a service-account key file's path, or its JSON (as"
        " ${ENV_VAR}). Unset: Google's application default credentials.",
    )
    azure_ad_token: str | None = Field(
        None, description="`azure/...`: an Azure AD (Entra ID) bearer token; as ${ENV_VAR}."
    )
    azure_tenant_id: str | None = Field(
        None, description="`azure/...`: Entra ID tenant, to sign in with client credentials."
    )
    azure_client_id: str | None = Field(
        None, description="`azure/...`: Entra ID application (client) id, with the tenant."
    )
    azure_client_secret: str | None = Field(
        None, description="`azure/...`: Entra ID client secret, with the two above; as ${ENV_VAR}."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_proxy_is_direct(cls, data: Any) -> Any:
        # `proxy: null` (or an empty value) says "no proxy", as `none` does; unset is the
        # environment's.
        if isinstance(data, dict) and "proxy" in data and not data["proxy"]:
            return {**data, "proxy": "none"}
        return data

    @field_validator("api_base")
    @classmethod
    def _api_base_url(cls, value: str | None) -> str | None:
        if value:
            check_url(value, ("http", "https"), "https://api.openai.com/v1")
        return value

    @field_validator("proxy")
    @classmethod
    def _proxy_url(cls, value: str | None) -> str | None:
        if value is not None and value.strip().lower() not in DIRECT:
            Proxy(value)  # ValueError (never quoting its credentials)
        return value

    @model_validator(mode="after")
    def _transport_settings(self) -> DeploymentConfig:
        own = "proxy" in self.model_fields_set or self.tls != TLSConfig()
        if self.provider == "litellm" and own:
            raise ValueError(
                "proxy and tls are not supported for provider 'litellm': litellm reads"
                " HTTPS_PROXY, HTTP_PROXY, NO_PROXY and SSL_CERT_FILE from the environment"
            )
        return self

    @model_validator(mode="after")
    def _one_price(self) -> DeploymentConfig:
        per_mtok = (self.input_cost_per_mtok, self.output_cost_per_mtok)
        if per_mtok.count(None) == 1:
            raise ValueError("set both input_cost_per_mtok and output_cost_per_mtok, or neither")
        if self.price is not None and None not in per_mtok:
            raise ValueError("set price or input_cost_per_mtok/output_cost_per_mtok, not both")
        return self

    @model_validator(mode="after")
    def _cloud_settings(self) -> DeploymentConfig:
        values = self.__dict__
        problems = cloud.problems(self.provider, self.model, values)
        if problems:
            raise ValueError("; ".join(problems))
        if cloud.needs_entra(values):
            extras.check(extras.ENTRA_ID)
        return self

    @field_validator("model")
    @classmethod
    def _provider_installed(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value and info.data.get("provider") == "litellm":
            extras.check(extras.provider_prefix(value))
        return value

    @model_validator(mode="after")
    def _needs_api_base(self) -> DeploymentConfig:
        if self.provider in ("openai", "azure") and not self.api_base:
            raise ValueError(f"provider {self.provider!r} needs api_base")
        if self.provider in ("azure", "litellm") and not self.model:
            raise ValueError(
                f"provider {self.provider!r} needs model (the Azure deployment name,"
                " or litellm's provider/model string)"
            )
        return self


class RetryConfig(_Model):
    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per request, first included.")
    backoff_s: float = Field(
        0.25, ge=0, description="First wait before retrying a deployment; doubles each time."
    )
    max_backoff_s: float = Field(8, ge=0, description="Longest single wait between attempts.")
    max_total_s: float = Field(
        60, gt=0, description="No new attempt starts after this long since the request began."
    )
    retry_after_cap_s: float = Field(
        20, ge=0, description="A longer upstream `Retry-After` is not waited for."
    )


class CooldownConfig(_Model):
    failures: int = Field(3, ge=1, description="Failures within `window_s` that start a cooldown.")
    window_s: float = Field(60, gt=0, description="How far back failures are counted.")
    cooldown_s: float = Field(
        30, ge=0, description="How long a failing deployment is skipped before one probe."
    )


class ModelConfig(_Model):
    name: str = Field(
        min_length=1,
        description="The alias clients send as `model`. Ending in `*` (`openai/*`, `claude-*`,"
        " `*`), a pattern: it serves every id that starts with what comes before the `*`"
        " (an exact alias wins, then the longest pattern), and a `*` in a deployment's `model`"
        " is replaced by what the alias's `*` matched.",
    )
    deployments: list[DeploymentConfig] = Field(min_length=1)
    strategy: Literal["fallback", "weighted", "least_busy", "latency", "cost"] = Field(
        "fallback", description="How the first deployment to try is chosen."
    )
    fallbacks: list[str] = Field(
        default_factory=list, description="Aliases whose deployments are tried after these."
    )
    retry: RetryConfig = Field(default_factory=RetryConfig)
    cooldown: CooldownConfig = Field(default_factory=CooldownConfig)
    on_client_disconnect: Literal["cancel", "drain"] = Field(
        "cancel",
        description="`cancel` closes the upstream at once; `drain` reads it to its end in the"
        " background (at most `drain_timeout_s`) to learn the provider's exact usage.",
    )
    continue_on_failure: bool = Field(
        False,
        description="When a stream fails after delivery began, continue the answer on the next"
        " deployment, sending it the delivered text, instead of ending with an error.",
    )
    drain_timeout_s: float = Field(
        30, gt=0, description="`drain` only: the longest time spent reading after a disconnect."
    )
    drop_params: bool = Field(
        False,
        description="Drop the request parameters a deployment cannot carry (listed in"
        " `X-Gateway-Dropped-Params`) instead of answering 400 `unsupported_parameter`.",
    )

    @model_validator(mode="after")
    def _patterns(self) -> ModelConfig:
        if "*" in self.name[:-1]:
            raise ValueError(f"alias {self.name!r}: a `*` may only end an alias name")
        for deployment in self.deployments:
            model = deployment.model or ""
            if model.count("*") > 1:
                raise ValueError(f"alias {self.name!r}: a deployment's model may hold one `*`")
            if "*" in model and not self.name.endswith("*"):
                raise ValueError(
                    f"alias {self.name!r}: a deployment's model may hold `*` only under an"
                    " alias whose name ends in `*` (a pattern)"
                )
        return self


class AuthConfig(_Model):
    master_key: str | None = Field(
        default_factory=lambda: os.environ.get("GATEWAY_MASTER_KEY") or None,
        validate_default=True,
        description="The admin key (default: the GATEWAY_MASTER_KEY environment variable)."
        " Without one the gateway runs open (no keys checked), for local use only, and says"
        " so at start.",
    )
    key_cache_s: float = Field(
        10,
        ge=0,
        description="How long a looked-up virtual key is trusted before the store is asked"
        " again (a key revoked by another process or replica stops working within this).",
    )
    key_stale_s: float = Field(
        900,
        ge=0,
        description="While the store cannot be read, a key looked up before keeps working from"
        " the cache for this long past its `key_cache_s` (stale-while-error); a revocation"
        " applies once the store answers again. 0: a key whose cache expired gets 503.",
    )

    max_failures: int = Field(
        10,
        ge=1,
        description="Wrong API keys a client address may present in `failure_window_s`;"
        " past them its wrong keys and the master key get 429 (with Retry-After) until the"
        " window ends, while virtual keys still work. Each failure is logged and counted.",
    )
    failure_window_s: float = Field(
        60, gt=0, description="The window `max_failures` is counted in, from the first failure."
    )

    @field_validator("master_key")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        if value == "":
            return None  # an unset ${VAR}: open mode, with the warning about the variable
        if value is not None and len(value) < 16:
            raise ValueError("master_key must be at least 16 characters")
        return value


class ConversationsConfig(_Model):
    threading: Literal["auto", "header", "off"] = Field(
        "auto",
        description="How a request finds its conversation. auto: an id the request names"
        " (X-Conversation-Id, metadata.conversation_id, a session header), else the"
        " conversation whose stored history the request's history continues (a new one"
        " when none does). header: only an id the request names. off: every request is a"
        " conversation of its own, and a request naming one is refused.",
    )
    session_headers: list[str] = Field(
        default_factory=list,
        description="More request headers that name the conversation, as X-Conversation-Id"
        " does (a session header clients already send to another gateway).",
    )
    repair_interrupted: bool = Field(
        True,
        description="With X-Conversation-Id, put back an interrupted answer that the client's"
        " history leaves out at its place (header X-Gateway-History-Repaired: 1).",
    )
    record_max_text_chars: int = Field(
        4_000_000,
        ge=1,
        description="Most characters of text and reasoning a turn's record keeps, its"
        " attempts' together; past them the stream is still relayed whole, but its record is"
        " cut there and marked `truncated_record` (metric gateway_truncated_records_total).",
    )
    record_max_tool_argument_chars: int = Field(
        4_000_000,
        ge=1,
        description="Most characters of tool-call arguments a turn's record keeps, its"
        " attempts' together; past them, as for text.",
    )


class LoggingConfig(_Model):
    format: Literal["text", "json"] = Field(
        "text",
        description="`text`: one readable line per record; `json`: one JSON object per line"
        " (a traceback stays inside its record), for log collectors.",
    )
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Least severe level written."
    )
    access_log: bool = Field(
        True,
        description="A line per request: method, path, status, duration, alias, deployment,"
        " key prefix, team, tokens, conversation and turn ids.",
    )

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class TracingConfig(_Model):
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint (`http://collector:4318/v1/traces`). Unset:"
        " no tracing. Needs the `otel` extra (`pip install 'gateway[otel]'`).",
    )
    service_name: str = Field("llm-gateway", description="The `service.name` of every span.")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Headers sent with each export (a collector's API key: write it as"
        " ${ENV_VAR}).",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of traces kept when the client sent no `traceparent` (a client's"
        " sampling decision is always followed).",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _installed(cls, value: str | None) -> str | None:
        if not value:
            return None  # an unset ${VAR}: no tracing, with the warning about the variable
        check_url(value, ("http", "https"), "http://host:4318/v1/traces, OTLP over HTTP")
        # Found, not imported: loading the SDK is the tracer's business, at start.
        if importlib.util.find_spec("opentelemetry") is None or (
            importlib.util.find_spec("opentelemetry.sdk") is None
        ):
            raise ValueError(
                "OpenTelemetry is not installed: install the gateway with its otel extra"
                " (pip install 'gateway[otel]')"
            )
        return value


class GatewayConfig(_Model):
    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    conversations: ConversationsConfig = Field(default_factory=ConversationsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    prices: str | None = Field(
        None,
        description="A price file of the operator's (JSON or YAML): upstream model ids to"
        " litellm's price fields, read at start, over litellm's bundled map.",
    )
    models: list[ModelConfig] = Field(default_factory=list)

    @field_validator("prices")
    @classmethod
    def _readable_prices(cls, value: str | None) -> str | None:
        if value is not None:
            load_price_file(value)  # ValueError: the file, the entry and what is wrong
        return value


def _alias_errors(models: Any) -> list[str]:
    """What is wrong between a config's aliases (one defined twice, a fallback to none),
    read from the raw `models` so that it is said with every other error of the file, not
    only once those are fixed."""
    if not isinstance(models, list):
        return []
    names = [m.get("name") if isinstance(m, dict) else None for m in models]
    errors: list[str] = []
    seen: set[Any] = set()
    for index, name in enumerate(names):
        if isinstance(name, str) and name in seen:
            errors.append(f"models[{index}].name: model alias {name!r} is defined twice")
        seen.add(name)
    for index, model in enumerate(models):
        fallbacks = model.get("fallbacks") if isinstance(model, dict) else None
        for other in fallbacks if isinstance(fallbacks, list) else ():
            if isinstance(other, str) and other not in seen:
                errors.append(
                    f"models[{index}].fallbacks: model {names[index]!r}: fallback alias"
                    f" {other!r} is not defined"
                )
    return errors


@dataclass(frozen=True)
class LoadedConfig:
    """The validated config plus what loading noticed (unset env vars, open mode, ...)."""

    config: GatewayConfig
    path: Path | None
    warnings: list[str] = field(default_factory=list)


def _interpolate(node: Any, where: str, missing: list[tuple[str, str]]) -> Any:
    """`node` with each `${NAME}` (or `${NAME:-default}`) replaced; the variables that are not
    set, as (field path, name), into `missing`."""
    if isinstance(node, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            value = os.environ.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    missing.append((where, name))
                    return ""
                return default
            return value

        return _ENV_REF.sub(replace, node)
    if isinstance(node, dict):
        return {
            k: _interpolate(v, f"{where}.{k}" if where else str(k), missing)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_interpolate(v, f"{where}[{i}]", missing) for i, v in enumerate(node)]
    return node


def _within(path: str, loc: str) -> bool:
    """Whether the field at `path` is the one at `loc` or inside it."""
    return loc == "(top level)" or path == loc or path.startswith((loc + ".", loc + "["))


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_config(raw: Any, source: str = "<config>") -> LoadedConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    if "model_list" in raw and "models" not in raw:
        raise ConfigError(
            f"{source}: a LiteLLM proxy config (model_list), not this gateway's: convert it"
            f" with `gateway import-litellm {source} -o gateway.yaml` (docs/migrating.md)"
        )
    missing: list[tuple[str, str]] = []
    data = _interpolate(raw, "", missing)
    lines = [f"{source}: {error}" for error in _alias_errors(data.get("models"))]
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = _field_path(tuple(err["loc"]))
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            # The empty value an unset variable left is what failed: say so, not only that
            # the field is wrong.
            unset = [f"${{{name}}}" for where, name in missing if _within(where, loc)]
            if unset:
                msg += f" ({', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set)"
            lines.append(f"{source}: {loc}: {msg}")
        raise ConfigError("\n".join(lines)) from None
    if lines:
        raise ConfigError("\n".join(lines))
    # An empty secret is only worth a warning: the upstream will answer 401 and say so.
    warnings = [f"{source}: {where}: environment variable {name} is not set"
                for where, name in missing]  # fmt: skip
    return LoadedConfig(config=config, path=None, warnings=warnings)


def load_config(path: Path | str | None = None) -> LoadedConfig:
    path = Path(path or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG_PATH)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from None
    if raw is None:
        # An empty file is a mistake (a volume not mounted, a template not rendered), not a
        # request for defaults: `make run` has its own file.
        raise ConfigError(f"{path}: the file is empty: it holds no setting (not even `models`)")
    loaded = parse_config(raw, str(path))
    try:
        environment_trust()  # read again when the upstream pool is made
    except TrustError as exc:
        raise ConfigError(str(exc)) from None
    return LoadedConfig(config=loaded.config, path=path, warnings=loaded.warnings)
