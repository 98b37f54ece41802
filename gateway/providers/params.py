"""What each upstream wire format does with each request parameter: nothing is lost unsaid.

Inside, every request is an OpenAI Chat Completions body. For each of its parameters a wire
format either sends it as it is (`SENT`), sends it in its own form (`MAPPED`, the adapter's
translation), leaves it to the gateway, which serves it whatever the upstream (`GATEWAY`: the
model alias, streaming and usage, `store` and `metadata`, which are recorded with the turn), or
cannot carry it (`REFUSED`). A refused parameter is a `400 unsupported_parameter` naming it and
the deployment, checked against every deployment of a request's plan before the first attempt
(`check_plan`), so a retry plan never reaches a deployment that would lose it; with the alias's
`drop_params: true` it is dropped for that deployment instead, and the answer lists what was
dropped in `X-Gateway-Dropped-Params`.

A parameter whose value asks for nothing (`n: 1`, `logprobs: false`, a penalty of 0, `null`) is
never refused. A field that is no parameter of the OpenAI API and no extension listed here
(`top_k`, `thinking`) reaches OpenAI-compatible deployments as sent and no other: it is not a
parameter the client's API has, so there is nothing to carry (such fields as `api_base` must
never steer an adapter either).

The adapters ask this module once, where each builds its upstream body: `anthropic_fields` and
`responses_fields` give the fields this module maps itself, `LITELLM_FORWARDED` is what the
litellm adapter hands litellm. This module in words: docs/providers.md, "Request parameters".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gateway.errors import UnsupportedParameter

SENT = "sent"
MAPPED = "mapped"
GATEWAY = "gateway"
REFUSED = "refused"
IGNORED = "ignored"  # no parameter of the client's API: only OpenAI-compatible upstreams get it

# A status, or a function of the value and the whole body that decides one.
Rule = str | Callable[[Any, Mapping[str, Any]], str]

# Every parameter of OpenAI's Chat Completions API (openai.types.chat.CompletionCreateParams),
# and the extensions the gateway understands: `thinking` (Anthropic's, sent by the /v1/messages
# dialect alongside `reasoning_effort`) and `top_k`.
CHAT_PARAMETERS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
        # extensions
        "thinking",
        "top_k",
        "anthropic_extras",
        "anthropic_request",
        "anthropic_headers",
        "completions_extras",
        "completions_request",
        "responses_extras",
    }
)

# What the /v1/messages dialect puts in a chat body beside the translation, for Anthropic
# deployments (gateway.dialects.anthropic_messages):
# - ANTHROPIC_EXTRAS: the request's own top-level fields that no other API has (`container`,
#   `context_management`, `mcp_servers`, `output_config` beyond its `format`, ...), by name.
#   An Anthropic deployment gets them as they are; any other refuses each by its own name (or,
#   with `drop_params`, drops it).
# - ANTHROPIC_REQUEST: the client's Messages body itself (`ClientBody`), which an Anthropic
#   deployment is sent as it came (its model replaced), so that nothing of it is lost in
#   translation (cache markers where the client put them, tool fields, block shapes), unless the
#   gateway changed its history on the way (a repair, restored thinking, a continuation).
# - ANTHROPIC_HEADERS: the client's `anthropic-version` and `anthropic-beta`, for the same.
ANTHROPIC_EXTRAS: Final = "anthropic_extras"
ANTHROPIC_REQUEST: Final = "anthropic_request"
ANTHROPIC_HEADERS: Final = "anthropic_headers"
# The same for /v1/completions (gateway.dialects.openai_completions) and the deployments that
# serve OpenAI's legacy `/completions` themselves: the parameters chat has no form for
# (`suffix`, `echo`, `best_of`, `logprobs` as a count), and the client's body.
COMPLETIONS_EXTRAS: Final = "completions_extras"
COMPLETIONS_REQUEST: Final = "completions_request"
# And for /v1/responses and deployments that speak the Responses API themselves: the tools that
# are no function (hosted `web_search`, a `namespace` of functions, ...), by their place
# (`tools[4]`).
RESPONSES_EXTRAS: Final = "responses_extras"
# Carriers of fields one wire alone takes, each refused by its fields' own names elsewhere.
EXTRAS = (ANTHROPIC_EXTRAS, COMPLETIONS_EXTRAS, RESPONSES_EXTRAS)
# Never recorded with the turn, never sent to another upstream.
PRIVATE = (ANTHROPIC_REQUEST, ANTHROPIC_HEADERS, COMPLETIONS_REQUEST)


@dataclass(frozen=True, eq=False)
class ClientBody:
    """A request as its client sent it, and the chat `messages` translated from it: the body
    is still the request's while the chat body holds that very list."""

    body: dict[str, Any]
    messages: list[dict[str, Any]]

    def current(self, chat: Mapping[str, Any]) -> dict[str, Any] | None:
        """The client's body, if the chat body's history is still the one translated from it."""
        return self.body if chat.get("messages") is self.messages else None


def _empty(value: Any) -> bool:
    return value in ({}, [], "")


# Values that ask for nothing beyond the default: never refused, whatever the wire.
NO_OP: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1,
    "logprobs": lambda v: v is False,
    "top_logprobs": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "presence_penalty": lambda v: v == 0,
    "logit_bias": _empty,
    "functions": _empty,
    "tools": _empty,
    "stop": _empty,
    "modalities": lambda v: v == ["text"],
    "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text",
    "reasoning_effort": lambda v: v == "none",
}

# The parameters every wire leaves to the gateway.
_GATEWAY: dict[str, Rule] = {
    "model": GATEWAY,  # the alias, replaced by the deployment's model
    "stream": GATEWAY,
    "stream_options": GATEWAY,  # usage is always asked for; the client sees what it asked
    "store": GATEWAY,  # the gateway records every turn
    "metadata": GATEWAY,  # recorded with the turn (its `conversation_id` is the gateway's)
    ANTHROPIC_REQUEST: GATEWAY,  # the translation beside it is what the others get
    ANTHROPIC_HEADERS: GATEWAY,
    COMPLETIONS_REQUEST: GATEWAY,
}


def _thinking_elsewhere(value: Any, body: Mapping[str, Any]) -> str:
    """Anthropic's `thinking` where the wire has `reasoning_effort`: the /v1/messages dialect
    sends both, so the effort carries it; alone, it has no form here."""
    return MAPPED if body.get("reasoning_effort") is not None else REFUSED


def _anthropic_service_tier(value: Any, body: Mapping[str, Any]) -> str:
    return MAPPED if value in _ANTHROPIC_TIERS else REFUSED


# The thinking budget each `reasoning_effort` becomes on Anthropic (the adapter reads it).
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}


def _anthropic_effort(value: Any, body: Mapping[str, Any]) -> str:
    return MAPPED if value in THINKING_BUDGETS else REFUSED


# OpenAI service tier -> Anthropic's: `auto` uses priority capacity when there is some,
# `standard_only` never does. `flex`, `scale` and `priority` have no Anthropic counterpart.
_ANTHROPIC_TIERS = {"auto": "auto", "default": "standard_only"}

ANTHROPIC: dict[str, Rule] = {
    **_GATEWAY,
    "messages": MAPPED,  # system, user, assistant and tool messages as content blocks
    "max_tokens": MAPPED,
    "max_completion_tokens": MAPPED,  # both are `max_tokens`
    "temperature": MAPPED,  # left out while thinking, which takes only the default
    "top_p": MAPPED,
    "stop": MAPPED,  # stop_sequences
    "tools": MAPPED,
    "tool_choice": MAPPED,
    "parallel_tool_calls": MAPPED,  # tool_choice.disable_parallel_tool_use
    "reasoning_effort": _anthropic_effort,  # a thinking budget
    "thinking": SENT,
    "top_k": SENT,
    "response_format": MAPPED,  # structured output
    "user": MAPPED,  # metadata.user_id
    "safety_identifier": MAPPED,  # metadata.user_id, when `user` gave none
    "service_tier": _anthropic_service_tier,
    ANTHROPIC_EXTRAS: SENT,
}

RESPONSES: dict[str, Rule] = {
    **_GATEWAY,
    "store": GATEWAY,  # always sent as false: the gateway keeps the state
    "metadata": SENT,
    "messages": MAPPED,  # input items and instructions
    "max_tokens": MAPPED,
    "max_completion_tokens": MAPPED,  # both are max_output_tokens
    "temperature": SENT,
    "top_p": SENT,
    "tools": MAPPED,
    "tool_choice": MAPPED,
    "parallel_tool_calls": SENT,
    "reasoning_effort": MAPPED,  # reasoning.effort
    "thinking": _thinking_elsewhere,
    "response_format": MAPPED,  # text.format
    "verbosity": MAPPED,  # text.verbosity
    "user": SENT,
    "safety_identifier": SENT,
    "service_tier": SENT,
    "prompt_cache_key": SENT,
    "prompt_cache_retention": SENT,
    RESPONSES_EXTRAS: SENT,
}

# What the litellm adapter hands `litellm.acompletion`, which maps each to its provider's own
# form; a deployment refuses those litellm says its model does not support. Any other field
# never reaches litellm: its keyword arguments also choose where and how it calls.
LITELLM_FORWARDED = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "reasoning_effort",
    "verbosity",
    "modalities",
    "audio",
    "prediction",
    "service_tier",
    "web_search_options",
    "thinking",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
)


def litellm_rules(supported: Iterable[str] | None) -> dict[str, Rule]:
    """A litellm deployment's table, from what litellm says its model supports (None: litellm
    cannot tell, so every forwarded parameter is tried)."""
    known = None if supported is None else frozenset(supported)
    rules: dict[str, Rule] = {**_GATEWAY, "messages": MAPPED}
    for name in LITELLM_FORWARDED:
        rules[name] = SENT if known is None or name in known else REFUSED
    # The gateway's own too (usage is grouped by it): never refused for want of a field.
    if rules["user"] == REFUSED:
        rules["user"] = GATEWAY
    if rules["thinking"] == REFUSED:
        rules["thinking"] = _thinking_elsewhere
    return rules


class _Deployment(Protocol):
    """What the policy needs of a deployment (gateway.routing.router.Deployment)."""

    @property
    def name(self) -> str: ...

    @property
    def provider_name(self) -> str: ...

    @property
    def upstream_model(self) -> str: ...

    @property
    def config(self) -> Any: ...

    @property
    def provider(self) -> Any: ...


@dataclass(frozen=True)
class Policy:
    """One deployment's table: the status of each parameter it is asked to carry."""

    wire: str
    rules: dict[str, Rule] | None = None  # None: every parameter is sent as it is
    # Parameters an OpenAI-compatible upstream gets in another form (the rest as sent).
    mapped: dict[str, Rule] = field(default_factory=dict)

    def status(self, name: str, value: Any, body: Mapping[str, Any]) -> str:
        if self.rules is None:
            rule: Rule = self.mapped.get(name, SENT)
        elif name not in CHAT_PARAMETERS:
            return IGNORED
        else:
            rule = self.rules.get(name, REFUSED)
        return rule(value, body) if callable(rule) else rule

    def refused(self, body: Mapping[str, Any]) -> list[str]:
        """The body's parameters this deployment cannot carry, in the body's order (the
        Messages API's own fields each by its name)."""
        out: list[str] = []
        for name, value in body.items():
            if value is None or (name in NO_OP and NO_OP[name](value)):
                continue
            if self.status(name, value, body) == REFUSED:
                if name in EXTRAS and isinstance(value, dict):
                    out += value
                else:
                    out.append(name)
        return out


# The demo answers every request with its fixed text: it takes every parameter and uses none.
_CARRIED: dict[str, Rule] = {name: GATEWAY for name in PRIVATE}
DEMO = Policy("demo", mapped=_CARRIED)
OPENAI = Policy(
    "openai_chat",
    mapped={
        "thinking": lambda v, b: _openai_thinking(b),
        ANTHROPIC_EXTRAS: REFUSED,
        COMPLETIONS_EXTRAS: REFUSED,
        RESPONSES_EXTRAS: REFUSED,
        **_CARRIED,
    },
)
# A deployment serving OpenAI's legacy `/completions` itself: it gets the client's own body.
COMPLETIONS = Policy(
    "openai_completions",
    mapped={
        ANTHROPIC_EXTRAS: REFUSED,
        COMPLETIONS_EXTRAS: SENT,
        RESPONSES_EXTRAS: REFUSED,
        **_CARRIED,
    },
)


def _openai_thinking(body: Mapping[str, Any]) -> str:
    """Anthropic's `thinking` sent by the /v1/messages dialect goes as its `reasoning_effort`;
    a chat client's own (some OpenAI-compatible servers take it) as it is."""
    return MAPPED if body.get("reasoning_effort") is not None else SENT


def policy(deployment: _Deployment) -> Policy:
    if getattr(deployment.provider, "wire", None) == "openai_completions":
        return COMPLETIONS
    provider = deployment.provider_name
    if provider == "anthropic":
        return Policy("anthropic", ANTHROPIC)
    if provider == "litellm":
        return Policy("litellm", litellm_rules(getattr(deployment.provider, "supported", None)))
    if provider == "demo":
        return DEMO
    if getattr(deployment.config, "api", None) == "responses":
        return Policy("openai_responses", RESPONSES)
    return OPENAI


def check_plan(
    body: Mapping[str, Any], plan: Iterable[_Deployment], *, drop: bool, alias: str
) -> dict[str, list[str]]:
    """The parameters each deployment of the plan drops (by deployment name), before the first
    attempt. Without `drop`, a parameter a deployment cannot carry is a 400 naming the first
    such deployment in plan order, whichever would have answered."""
    dropped: dict[str, list[str]] = {}
    for deployment in plan:
        refused = policy(deployment).refused(body)
        if not refused:
            continue
        if drop:
            dropped[deployment.name] = refused
            continue
        name = refused[0]
        others = f" (nor {', '.join(repr(n) for n in refused[1:])})" if refused[1:] else ""
        value = _short(_value(body, name))
        raise UnsupportedParameter(
            f"Unsupported parameter: {name!r} (value {value}) cannot be sent to"
            f" deployment {deployment.name!r} ({deployment.provider_name},"
            f" model {deployment.upstream_model!r}){others}. Remove it, or set"
            f" `drop_params: true` on model {alias!r} to have the gateway drop it.",
            param=name,
        )
    return dropped


def _value(body: Mapping[str, Any], name: str) -> Any:
    if name in body:
        return body[name]
    for carrier in EXTRAS:
        extras = body.get(carrier)
        if isinstance(extras, dict) and name in extras:
            return extras[name]
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def without(body: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """`body` less the named parameters (the same object when there are none); a Messages
    API field is taken out of the extras, and the client's own body is left behind."""
    names = set(names)
    if not names:
        return body
    out = {k: v for k, v in body.items() if k not in names}
    carriers = ((ANTHROPIC_EXTRAS, ANTHROPIC_REQUEST), (COMPLETIONS_EXTRAS, None))
    for carrier, request in (*carriers, (RESPONSES_EXTRAS, None)):
        extras = body.get(carrier)
        if not (isinstance(extras, dict) and names & extras.keys()):
            continue
        if request is not None:
            out.pop(request, None)  # it holds them: the translation goes instead
        kept = {k: v for k, v in extras.items() if k not in names}
        if kept:
            out[carrier] = kept
        else:
            out.pop(carrier, None)
    return out


def dropped_header(names: Iterable[str]) -> str:
    """The value of `X-Gateway-Dropped-Params`."""
    return ", ".join(names)


# -- a translated body to an OpenAI-compatible upstream ---------------------------------------

# What the other dialects' translations put in a chat body for the Anthropic adapter to read back
# (docs/providers.md, "Anthropic deployments"), on messages, content parts, tool calls and tools:
# no OpenAI API has them, and OpenAI refuses a message with a key it does not know. (Earlier
# reasoning stays, as `reasoning_content`: the OpenAI-compatible servers that reason take it.)
CARRIERS = ("cache_control", "thinking_blocks", "is_error")


def takes_openai_only(deployment: _Deployment) -> bool:
    """Whether a deployment speaks the OpenAI chat API itself (litellm reads the carriers)."""
    return policy(deployment) is OPENAI


def openai_form(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body the gateway translated from another dialect, as the OpenAI API has it: no
    carriers, and Anthropic's `thinking` only as the `reasoning_effort` beside it. (A chat
    client's own body is relayed as it sent it.)"""

    def clean(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        out = {k: v for k, v in item.items() if k not in CARRIERS}
        for key in ("content", "tool_calls"):
            if isinstance(out.get(key), list):
                out[key] = [clean(part) for part in out[key]]
        return out

    out = {k: v for k, v in body.items() if k not in (*EXTRAS, *PRIVATE)}
    out["messages"] = [clean(m) for m in body.get("messages") or ()]
    if isinstance(body.get("tools"), list):
        out["tools"] = [clean(tool) for tool in body["tools"]]
    if out.get("reasoning_effort") is not None:
        out.pop("thinking", None)
    return out


# -- the fields this module maps itself, asked for where each adapter builds its body -----------


def anthropic_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Messages API fields for `top_k`, `service_tier` and `safety_identifier`."""
    out: dict[str, Any] = {}
    top_k = body.get("top_k")
    if top_k is not None:
        out["top_k"] = top_k
    tier = body.get("service_tier")
    if isinstance(tier, str) and tier in _ANTHROPIC_TIERS:
        out["service_tier"] = _ANTHROPIC_TIERS[tier]
    user, safety = body.get("user"), body.get("safety_identifier")
    if not (isinstance(user, str) and user) and isinstance(safety, str) and safety:
        out["metadata"] = {"user_id": safety}
    return out


def responses_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Responses API fields for `response_format`, `verbosity`, the service tier, the prompt
    cache and the safety identifier."""
    out: dict[str, Any] = {}
    text: dict[str, Any] = {}
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_object":
        text["format"] = {"type": "json_object"}
    elif isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema")
        schema = schema if isinstance(schema, dict) else {}
        text["format"] = {"type": "json_schema", **schema}
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        out["text"] = text
    for name in ("service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier"):
        if body.get(name) is not None:
            out[name] = body[name]
    return out
