"""`gateway import-litellm config.yaml`: a LiteLLM proxy config as this gateway's config.

LiteLLM's `model_list` becomes aliases and their deployments (entries sharing a `model_name`
are one alias), `litellm_params` deployment fields, `router_settings` and `litellm_settings`
each alias's routing, retries, cooldowns and fallbacks (the router's Redis the replicas'),
`general_settings` the master key and the store; LiteLLM's proxy-wide budgets are listed with
the team or key `limits` that keep them. `os.environ/NAME` becomes `${NAME}`. What has no
counterpart here is listed, never dropped in silence: the operator reads the list and decides.

Providers: `openai/`, `azure/` and `anthropic/` models (and bare OpenAI and Claude model ids)
are served by the gateway's own adapters; every other LiteLLM provider prefix (`bedrock/`,
`vertex_ai/`, `gemini/`, `groq/`, `ollama/`, ...) stays `provider: litellm` with the model as
written (of which Groq, Mistral and Cohere's chat are then spoken by the gateway itself).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# LiteLLM's routing strategies, as this gateway names them.
_STRATEGIES = {
    "simple-shuffle": "weighted",
    "least-busy": "least_busy",
    "latency-based-routing": "latency",
    "cost-based-routing": "cost",
}
# Bare model ids LiteLLM sends to OpenAI or Anthropic without a prefix.
_OPENAI_BARE = re.compile(r"^(gpt-|chatgpt-|o\d|text-embedding-|dall-e|whisper-|tts-|omni-)")
# litellm_params copied under the same name (cloud settings, per deployment).
_SAME = (
    "api_base",
    "api_version",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "vertex_project",
    "vertex_location",
    "vertex_credentials",
)
_RENAMED = {"aws_region_name": "aws_region", "aws_profile_name": "aws_profile"}
# Per-deployment prices LiteLLM reads from litellm_params (USD per token).
_PRICES = ("input_cost_per_token", "output_cost_per_token")
OPENAI_API = "https://api.openai.com/v1"
# The shortest master key this gateway takes (gateway.config).
_MASTER_MIN = 16
# What a whole answer may take, in LiteLLM's words.
_TIMEOUTS = ("timeout", "request_timeout")


class Converted:
    """The gateway config made, and what had no counterpart (`path: why`)."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.unmapped: list[str] = []

    def skip(self, where: str, why: str) -> None:
        line = f"{where}: {why}"
        if line not in self.unmapped:  # a router setting is met once per alias
            self.unmapped.append(line)


def convert(litellm: dict[str, Any]) -> Converted:
    out = Converted()
    router = _mapping(litellm.get("router_settings"))
    settings = _mapping(litellm.get("litellm_settings"))
    general = _mapping(litellm.get("general_settings"))
    aliases: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(litellm.get("model_list") or []):
        where = f"model_list[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("model_name"), str):
            out.skip(where, "no model_name")
            continue
        deployment = _deployment(entry, where, out)
        if deployment is None:
            continue
        alias = aliases.setdefault(
            entry["model_name"], {"name": entry["model_name"], "deployments": []}
        )
        alias["deployments"].append(deployment)
    for alias in aliases.values():
        _routing(alias, router, settings, out)
    out.config["models"] = list(aliases.values())
    _general(general, out)
    _redis(router, out)
    _budgets(settings, out)
    for section, values in (("litellm_settings", settings), ("router_settings", router)):
        for key in sorted(set(values) - _USED[section]):
            out.skip(f"{section}.{key}", "no counterpart in this gateway")
    for key in sorted(set(litellm) - _TOP):
        out.skip(key, "no counterpart in this gateway")
    return out


# LiteLLM's proxy-wide budgets: (the setting, its period's setting, where it goes here).
_BUDGETS = (
    ("max_budget", "budget_duration", "each team's `limits.budget`"),
    ("max_internal_user_budget", "internal_user_budget_duration", "each key's `limits.budget`"),
    ("max_end_user_budget", None, "each team's `limits.end_user.budget`"),
)
# LiteLLM's budget durations, as this gateway's budget periods.
_PERIODS = {"1d": "day", "24h": "day", "7d": "week", "1w": "week", "30d": "month", "1mo": "month"}
_REDIS = ("redis_url", "redis_host", "redis_port", "redis_password")
_USED = {
    "litellm_settings": {
        "drop_params",
        "num_retries",
        "request_timeout",
        "fallbacks",
        *(name for budget in _BUDGETS for name in budget[:2] if name),
    },
    "router_settings": {
        "routing_strategy",
        "num_retries",
        "timeout",
        "fallbacks",
        "allowed_fails",
        "cooldown_time",
        *_REDIS,
    },
}
_TOP = {"model_list", "router_settings", "litellm_settings", "general_settings"}


def _deployment(entry: dict[str, Any], where: str, out: Converted) -> dict[str, Any] | None:
    params = _mapping(entry.get("litellm_params"))
    model = params.get("model")
    if not isinstance(model, str) or not model:
        out.skip(where, "litellm_params.model is missing")
        return None
    prefix, slash, rest = model.partition("/")
    deployment: dict[str, Any]
    if slash and prefix in ("openai", "azure", "anthropic"):
        deployment = {"provider": prefix, "model": rest}
    elif not slash and _OPENAI_BARE.match(model):
        deployment = {"provider": "openai", "model": model}
    elif not slash and model.startswith("claude"):
        deployment = {"provider": "anthropic", "model": model}
    else:
        deployment = {"provider": "litellm", "model": model}
    for key in _SAME:
        if params.get(key) is not None:
            deployment[key] = _value(params[key])
    if deployment["provider"] == "openai":
        deployment.setdefault("api_base", OPENAI_API)  # LiteLLM's default, said here
    for key, name in _RENAMED.items():
        if params.get(key) is not None:
            deployment[name] = _value(params[key])
    if params.get("api_key") is not None:
        deployment["api_key"] = _value(params["api_key"])
        if not str(params["api_key"]).startswith("os.environ/"):
            out.skip(f"{where}.litellm_params.api_key", "copied as written: prefer ${ENV_VAR}")
    timeout = next((params[k] for k in _TIMEOUTS if isinstance(params.get(k), int | float)), None)
    if timeout is not None:
        deployment["timeouts"] = {"total_s": float(timeout)}
    if isinstance(params.get("stream_timeout"), int | float):
        deployment.setdefault("timeouts", {})["first_token_s"] = float(params["stream_timeout"])
    if all(isinstance(params.get(k), int | float) for k in _PRICES):
        deployment["price"] = {k: float(params[k]) for k in _PRICES}
    if isinstance(params.get("weight"), int | float) and params["weight"] > 0:
        deployment["weight"] = params["weight"]
    if isinstance(params.get("order"), int):
        deployment["priority"] = params["order"]
    if isinstance(params.get("max_parallel_requests"), int):
        deployment["max_concurrency"] = params["max_parallel_requests"]
    known = {
        "model",
        "api_key",
        "stream_timeout",
        "weight",
        "order",
        "max_parallel_requests",
        *_SAME,
        *_RENAMED,
        *_PRICES,
        *_TIMEOUTS,
    }
    for key in sorted(set(params) - known):
        why = (
            "per-deployment rate limits are per key and team here (limits)"
            if key in ("rpm", "tpm")
            else "no counterpart in this gateway"
        )
        out.skip(f"{where}.litellm_params.{key}", why)
    if entry.get("model_info"):
        out.skip(f"{where}.model_info", "model facts come from the bundled model map here")
    return deployment


def _routing(
    alias: dict[str, Any], router: dict[str, Any], settings: dict[str, Any], out: Converted
) -> None:
    strategy = router.get("routing_strategy")
    if isinstance(strategy, str):
        if strategy in _STRATEGIES:
            alias["strategy"] = _STRATEGIES[strategy]
        else:
            alias["strategy"] = "weighted"
            out.skip("router_settings.routing_strategy", f"{strategy!r} is routed as weighted")
    retries = router.get("num_retries", settings.get("num_retries"))
    if isinstance(retries, int) and retries >= 0:
        alias["retry"] = {"max_attempts": min(retries + 1, 20)}
    cooldown: dict[str, Any] = {}
    if isinstance(router.get("allowed_fails"), int) and router["allowed_fails"] >= 0:
        cooldown["failures"] = router["allowed_fails"] + 1  # LiteLLM cools down past them
    if isinstance(router.get("cooldown_time"), int | float):
        cooldown["cooldown_s"] = float(router["cooldown_time"])
    if cooldown:
        alias["cooldown"] = cooldown
    if settings.get("drop_params") is True:
        alias["drop_params"] = True
    timeout = router.get("timeout", settings.get("request_timeout"))
    if isinstance(timeout, int | float):
        for deployment in alias["deployments"]:
            deployment.setdefault("timeouts", {}).setdefault("total_s", float(timeout))
    fallbacks = [*_list(router.get("fallbacks")), *_list(settings.get("fallbacks"))]
    for rule in fallbacks:
        if isinstance(rule, dict) and isinstance(rule.get(alias["name"]), list):
            targets = [t for t in rule[alias["name"]] if isinstance(t, str)]
            alias["fallbacks"] = [*alias.get("fallbacks", []), *targets]


def _general(general: dict[str, Any], out: Converted) -> None:
    master = general.get("master_key")
    if isinstance(master, str) and master.startswith("os.environ/"):
        out.config["auth"] = {"master_key": _value(master)}
    elif isinstance(master, str) and len(master) < _MASTER_MIN:
        out.config["auth"] = {"master_key": "${GATEWAY_MASTER_KEY}"}
        out.skip(
            "general_settings.master_key",
            f"shorter than the {_MASTER_MIN} characters this gateway takes: set"
            " GATEWAY_MASTER_KEY to a longer one",
        )
    elif isinstance(master, str) and master:
        out.config["auth"] = {"master_key": master}
        out.skip("general_settings.master_key", "copied as written: prefer ${ENV_VAR}")
    database = general.get("database_url")
    if isinstance(database, str) and database:
        out.config["store"] = {"url": _value(database)}
    for key in sorted(set(general) - {"master_key", "database_url"}):
        out.skip(f"general_settings.{key}", "no counterpart in this gateway")


def _redis(router: dict[str, Any], out: Converted) -> None:
    """The Redis LiteLLM's router shares cooldowns and usage through: the replicas' here."""
    url = router.get("redis_url")
    host = router.get("redis_host")
    if isinstance(url, str) and url:
        out.config.setdefault("limits", {})["redis_url"] = _value(url)
    elif isinstance(host, str) and host:
        port = router.get("redis_port", 6379)
        password = router.get("redis_password")
        auth = f":{_value(password)}@" if isinstance(password, str) and password else ""
        redis_url = f"redis://{auth}{_value(host)}:{_value(port)}/0"
        out.config.setdefault("limits", {})["redis_url"] = redis_url


def _budgets(settings: dict[str, Any], out: Converted) -> None:
    """Budgets are on teams and keys here (the admin API, not this file): each of LiteLLM's is
    listed with the `limits` that keep it."""
    for name, duration, where in _BUDGETS:
        usd = settings.get(name)
        if not isinstance(usd, int | float) or isinstance(usd, bool):
            continue
        given = settings.get(duration) if duration else None
        period = _PERIODS.get(str(given), "total") if given is not None else "total"
        limit = f'{{"usd": {usd:g}, "period": "{period}", "mode": "hard"}}'
        note = "" if given is None or str(given) in _PERIODS else f" ({given!r} has no period here)"
        out.skip(
            f"litellm_settings.{name}",
            f"budgets are set on teams and keys here: give {where} {limit}{note}"
            " (PATCH /v1/gateway/teams/{id} or /v1/gateway/keys/{id})",
        )


def _value(value: Any) -> Any:
    """LiteLLM's `os.environ/NAME` as this config writes a variable."""
    if isinstance(value, str) and value.startswith("os.environ/"):
        return "${" + value.removeprefix("os.environ/") + "}"
    return value


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def main(args: argparse.Namespace) -> int:
    """The command: the converted config on stdout (or `--output`), what was not mapped on
    stderr as YAML comments, exit 2 for a file that is not a LiteLLM config."""
    try:
        raw = yaml.safe_load(Path(args.file).read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.file}: cannot read: {exc}", file=sys.stderr)
        return 2
    if not isinstance(raw, dict) or not isinstance(raw.get("model_list"), list):
        print(f"{args.file}: not a LiteLLM config (no model_list)", file=sys.stderr)
        return 2
    converted = convert(raw)
    text = f"# Converted from the LiteLLM config {args.file} by `gateway import-litellm`.\n"
    text += yaml.safe_dump(converted.config, sort_keys=False, allow_unicode=True)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    for line in converted.unmapped:
        print(f"# not mapped: {line}", file=sys.stderr)
    return 0
