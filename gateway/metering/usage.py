"""Usage records: one per attempt, written when its turn ends.

Keeps apart what was *generated and billed* (the provider's own count; where the whole count
never came, as after a cancel, what the provider did say before the cut and a tokenizer
estimate of the rest, flagged `usage_source: "estimated"`, or `"estimated_lower_bound"` where
the turn asked for reasoning the stream may not show) and what was *delivered* (the tokens of
the part the client received). Cost comes from the deployment's price
(gateway.metering.prices), each kind of token at its own: cache reads, 5-minute and 1-hour
cache writes, the rest of the prompt, and the output, reasoning included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import orjson

from gateway import metrics
from gateway.metering.choices import OtherChoices, other_choices
from gateway.metering.limits import Lease
from gateway.metering.prices import Price, map_entry, price_columns
from gateway.metering.prompt_cache import PromptCacheReads
from gateway.metering.tokens import count_messages, count_text, vendor_of
from gateway.stream.assembler import BlockAssembler
from gateway.stream.attempt_log import AttemptLog
from gateway.stream.events import TOOL_CALL, StreamEvent


class Attempt(Protocol):
    """What the meter reads of an attempt (gateway.conversations.recorder.Attempt)."""

    number: int
    log: AttemptLog
    id_from: Any  # its stream's parser, whose `others` hold an n > 1 request's other choices
    outcome: str | None
    delivered: int
    ended: float | None

    @property
    def route(self) -> Mapping[str, Any]: ...

    @property
    def started(self) -> float: ...

    @property
    def first_token_ms(self) -> float | None: ...

    @property
    def usage(self) -> dict[str, Any] | None: ...


class TurnRecorder(Protocol):
    """What the meter reads of a turn (gateway.conversations.recorder.TurnRecorder)."""

    conversation_id: str
    turn_id: str
    team_id: str | None
    key_id: str | None
    user: str | None
    alias: str | None
    prompt: list[Any]
    lease: Lease | None
    reasoning: bool
    tags: str | None

    @property
    def attempts(self) -> Sequence[Attempt]: ...


# Not frozen: a frozen dataclass sets each of these 21 fields through object.__setattr__, a
# microsecond and a half a record; nothing changes one after it is made.
@dataclass
class UsageRecord:
    id: str
    turn_id: str
    conversation_id: str
    team_id: str | None
    key_id: str | None
    user: str | None
    alias: str | None
    deployment: str
    provider: str
    model: str
    created_at: float
    status: str  # completed | interrupted | error
    prompt_tokens: int
    completion_tokens: int  # generated
    completion_delivered: int
    reasoning_tokens: int
    cached_tokens: int
    usage_source: str  # provider | estimated | estimated_lower_bound
    cost_usd: float | None
    ttft_ms: float | None
    duration_ms: float | None
    # Prompt tokens written to the provider's cache (Anthropic's), by how long they stay: billed
    # at the cache-write prices, not the input price. Part of prompt_tokens, as cached_tokens
    # (the tokens read from the cache) are.
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    # Audio tokens inside prompt_tokens and completion_tokens (OpenAI's audio models), billed at
    # the audio prices where the model has them: what a report re-rates the row by.
    audio_prompt_tokens: int = 0
    audio_completion_tokens: int = 0
    # An API call that is no turn (gateway.pipeline.calls): its endpoint (`images.generations`),
    # what it was billed by, as JSON (`{"images": 2, "size": "1024x1024"}`), and for a failed
    # one, its error code. None for a turn's attempts.
    endpoint: str | None = None
    units: str | None = None
    error: str | None = None
    # What the row was charged at (gateway.metering.prices.price_columns): the unit prices as
    # JSON and where they came from; and the request's metadata tags as JSON.
    prices: str | None = None
    price_source: str | None = None
    tags: str | None = None

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)  # flat fields: asdict's deep copy costs 20x more


def tags_json(metadata: dict[str, Any]) -> str | None:
    """A request's `metadata` as its usage rows keep it (their `tags`): its text values by
    key, as JSON; None when it has none."""
    tags = {k: v for k, v in metadata.items() if isinstance(v, str) and isinstance(k, str)}
    return orjson.dumps(tags, option=orjson.OPT_SORT_KEYS).decode() if tags else None


# From the most exact to the least: `provider_clamped` is the provider's count with the parts
# it got wrong (negative, not a number, absurd) replaced by the gateway's estimate; `litellm`,
# litellm's own count of a provider that sent none it reads (gateway.providers.litellm_adapter).
_SOURCES = ("provider", "provider_clamped", "litellm", "estimated", "estimated_lower_bound")
LITELLM = "litellm"
CLAMPED = "provider_clamped"

# A count no request comes near (the largest context windows hold 10 million tokens): a
# provider reporting more has it wrong.
MAX_REPORTED_TOKENS = 100_000_000
_WRONG = -1


def _count(value: Any) -> int:
    """A count as a provider reported it: 0 when absent, `_WRONG` when it is no count (negative,
    not a whole number, past `MAX_REPORTED_TOKENS`)."""
    if type(value) is int:  # never a bool: its type is bool
        return value if 0 <= value <= MAX_REPORTED_TOKENS else _WRONG
    if value is None:
        return 0
    if type(value) is float and value.is_integer() and 0 <= value <= MAX_REPORTED_TOKENS:
        return int(value)
    return _WRONG


class ProviderCounts(NamedTuple):
    prompt: int  # every input token: plain, read from the cache, written to it
    completion: int  # every output token, reasoning included
    reasoning: int
    cached: int  # read from the cache
    cache_write_5m: int
    cache_write_1h: int


class CheckedCounts(NamedTuple):
    counts: ProviderCounts  # each wrong count as 0
    wrong: tuple[str, ...]  # the fields the provider got wrong, by name (`_FIELDS`)
    prompt_wrong: bool  # the prompt count cannot be trusted
    completion_wrong: bool  # nor the completion's


def _details(usage: dict[str, Any], name: str) -> dict[str, Any]:
    value = usage.get(name)
    return value if isinstance(value, dict) else {}


# The fields `checked_counts` reads, in its order; `provider_usage.` is the provider's own
# report as an adapter translated it (Anthropic's, the Responses API's).
_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "completion_tokens_details.reasoning_tokens",
    "prompt_tokens_details.cached_tokens",
    "cache_read_input_tokens",
    "provider_usage.cache_creation_input_tokens",
    "cache_creation_input_tokens",
    "prompt_tokens_details.cache_creation_tokens",
    "cache_creation.ephemeral_1h_input_tokens",
    "cache_creation.ephemeral_5m_input_tokens",
    "total_tokens",
    "provider_usage.input_tokens",
    "provider_usage.output_tokens",
)
_PROMPT_FIELDS = frozenset(("prompt_tokens", "provider_usage.input_tokens"))
_COMPLETION_FIELDS = frozenset(("completion_tokens", "provider_usage.output_tokens"))


def provider_counts(usage: dict[str, Any]) -> ProviderCounts:
    """A provider's usage as the counts each price applies to (`checked_counts`)."""
    return checked_counts(usage).counts


def checked_counts(usage: dict[str, Any]) -> CheckedCounts:
    """A provider's usage (in OpenAI's names, the provider's own under `provider_usage`) as the
    counts each price applies to, and which of them the provider got wrong: a provider's report
    is input like any other, and a negative or absurd count must not bill, or refund, anyone.

    - Cache reads: OpenAI's `prompt_tokens_details.cached_tokens` (Anthropic's
      `cache_read_input_tokens` arrive there too).
    - Cache writes: Anthropic's `cache_creation_input_tokens`, split by its `cache_creation`
      (`ephemeral_5m_input_tokens`, `ephemeral_1h_input_tokens`); litellm's
      `prompt_tokens_details.cache_creation_tokens` and `cache_creation_token_details` likewise.
      A write without the split is a 5-minute one (Anthropic's default).
    - Reasoning is output, inside `completion_tokens` as OpenAI counts it; a provider that counts
      it beside them (reasoning more than the completion, or a total that adds it) has it added.
    """
    if _CACHE_FIELDS.isdisjoint(usage):
        prompt_details = _details(usage, "prompt_tokens_details")
        if _CACHE_DETAILS.isdisjoint(prompt_details):
            # The usual report (OpenAI's own shape, no cache writes): the same counts, read
            # without the fields that cannot be there.
            prompt = _count(usage.get("prompt_tokens"))
            completion = _count(usage.get("completion_tokens"))
            reasoning = _count(_details(usage, "completion_tokens_details").get("reasoning_tokens"))
            cached = _count(prompt_details.get("cached_tokens"))
            total = _count(usage.get("total_tokens"))
            if min(prompt, completion, reasoning, cached, total) >= 0:
                if reasoning and (
                    reasoning > completion or total == prompt + completion + reasoning
                ):
                    completion += reasoning
                counts = ProviderCounts(max(prompt, cached), completion, reasoning, cached, 0, 0)
                return CheckedCounts(counts, (), False, False)
    return _checked_counts(usage)


# What only a report with cache reads in Anthropic's names, or cache writes, has.
_CACHE_FIELDS = frozenset(
    ("provider_usage", "cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")
)
_CACHE_DETAILS = frozenset(("cache_creation_tokens", "cache_creation_token_details"))


def _checked_counts(usage: dict[str, Any]) -> CheckedCounts:
    """`checked_counts` of any report."""
    prompt_details = _details(usage, "prompt_tokens_details")
    provider = _details(usage, "provider_usage")
    raw = provider or usage
    split = _details(raw, "cache_creation") or _details(
        prompt_details, "cache_creation_token_details"
    )
    values: tuple[int, ...] = (
        _count(usage.get("prompt_tokens")),
        _count(usage.get("completion_tokens")),
        _count(_details(usage, "completion_tokens_details").get("reasoning_tokens")),
        _count(prompt_details.get("cached_tokens")),
        _count(usage.get("cache_read_input_tokens")),
        _count(provider.get("cache_creation_input_tokens")),
        _count(usage.get("cache_creation_input_tokens")),
        _count(prompt_details.get("cache_creation_tokens")),
        _count(split.get("ephemeral_1h_input_tokens")),
        _count(split.get("ephemeral_5m_input_tokens")),
        _count(usage.get("total_tokens")),
        _count(provider.get("input_tokens")),
        _count(provider.get("output_tokens")),
    )
    wrong: tuple[str, ...] = ()
    if min(values) < 0:
        wrong = tuple(name for name, value in zip(_FIELDS, values, strict=True) if value < 0)
        values = tuple(max(0, value) for value in values)
    prompt, completion, reasoning, cached, read, written, top, details, hour, five, total = values[
        :11
    ]
    cached = cached or read
    written = max(written or top or details, hour + five)
    hour = min(hour, written)
    prompt = max(prompt, cached + written)
    if reasoning and (reasoning > completion or total == prompt + completion + reasoning):
        completion += reasoning
    counts = ProviderCounts(prompt, completion, reasoning, cached, written - hour, hour)
    if not wrong:
        return CheckedCounts(counts, wrong, False, False)
    return CheckedCounts(
        counts,
        wrong,
        not _PROMPT_FIELDS.isdisjoint(wrong),
        not _COMPLETION_FIELDS.isdisjoint(wrong),
    )


def _prompt_estimate(turn: TurnRecorder, attempt: Attempt) -> int:
    """The attempt's prompt by tokenizer: its messages, and what the request sent besides them
    (tool definitions, output schemas), by the rules of the deployment's provider."""
    model = str(attempt.route.get("model"))
    vendor = vendor_of(str(attempt.route.get("provider")), model)
    prompt = count_messages(turn.prompt, vendor, model)
    extras = turn.lease.extras if turn.lease is not None else None
    return prompt + extras.tokens(vendor) if extras is not None else prompt


def _extras(turn: TurnRecorder) -> list[Any] | None:
    """What the turn's request sent besides its messages (tools, schemas), as sent."""
    extras = turn.lease.extras if turn.lease is not None else None
    return extras.values if extras is not None else None


def _generated_tokens(events: Iterable[StreamEvent]) -> tuple[int, int]:
    """(completion, reasoning) tokens of some received or delivered events, by tokenizer."""
    blocks = BlockAssembler.of(events).blocks()
    reasoning = sum(count_text(b.text) for b in blocks if b.kind == "reasoning")
    other = sum(
        count_text(b.text) + (count_text(b.name or "") if b.kind == TOOL_CALL else 0)
        for b in blocks
        if b.kind != "reasoning"
    )
    return other + reasoning, reasoning


def _delivered_content(message: dict[str, Any] | None, number: int) -> list[dict[str, Any]]:
    """The blocks attempt `number` delivered, from a checkpoint's interrupted message."""
    if message is None:
        return []
    for segment in message.get("segments") or ():
        if segment["attempt"] == number:
            return list(segment["content"])
    return list(message["content"]) if message["attempt"] == number else []


def _tokens_of(blocks: list[dict[str, Any]]) -> tuple[int, int]:
    """(completion, reasoning) tokens of stored blocks, by tokenizer."""
    reasoning = sum(count_text(b.get("text") or "") for b in blocks if b["type"] == "reasoning")
    other = sum(
        count_text(b.get("text") or b.get("arguments") or "") + count_text(b.get("name") or "")
        for b in blocks
        if b["type"] != "reasoning"
    )
    return other + reasoning, reasoning


# How much each new report moves a deployment's usual reasoning (an exponential average).
_REASONING_WEIGHT = 0.2


def reasons_unasked(model: str, provider: str) -> bool:
    """Whether the model reasons whether or not it is asked (OpenAI's o-series and gpt-5, by
    the bundled map's `supports_reasoning`), its reasoning hidden from the stream."""
    entry = map_entry(model, provider)
    return bool(entry and entry.get("supports_reasoning")) and provider in _HIDDEN_REASONING


# Providers whose reasoning never reaches the stream (Anthropic's and others' only when asked).
_HIDDEN_REASONING = ("openai", "azure")


def audio_counts(usage: dict[str, Any]) -> tuple[int, int]:
    """The audio tokens inside a provider's prompt and completion counts (OpenAI's
    `prompt_tokens_details.audio_tokens`, `completion_tokens_details.audio_tokens`)."""
    prompt = _details(usage, "prompt_tokens_details").get("audio_tokens")
    completion = _details(usage, "completion_tokens_details").get("audio_tokens")
    return max(_count(prompt), 0), max(_count(completion), 0)  # a wrong one counts as text


def cost_header(cost: float) -> str:
    """`X-Gateway-Cost-USD`: dollars in plain decimal notation (never `3.5e-05`), to the
    micro-cent the usage row keeps."""
    return f"{cost:.10f}".rstrip("0").rstrip(".") or "0"


def _totals(record: UsageRecord) -> dict[str, Any]:
    """Meter.turn's totals of a turn with one attempt (the same values the sums give)."""
    cost = record.cost_usd
    return {
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "completion_delivered": record.completion_delivered,
        "reasoning_tokens": record.reasoning_tokens,
        "cached_tokens": record.cached_tokens,
        "cache_write_5m_tokens": record.cache_write_5m_tokens,
        "cache_write_1h_tokens": record.cache_write_1h_tokens,
        "cost_usd": round(cost, 10) if cost is not None else None,
        "usage_source": record.usage_source,
    }


class Meter:
    def __init__(
        self,
        price_of: Callable[[str, str], Price | None],
        write: Callable[[UsageRecord], None],
    ) -> None:
        self._price_of = price_of  # (deployment name, upstream model) -> price
        self._write = write
        self._counters: dict[tuple[str, str, str], tuple[tuple[Any, ...], Any]] = {}
        # Each deployment's reasoning tokens per answer, as its provider reported them (a
        # moving average): what a cancelled answer of a model that reasons out of sight is
        # taken to have spent on it.
        self._reasoning: dict[str, float] = {}
        # Each conversation's last report of cache reads: what a cancelled turn's repeated
        # prompt is known to have read from the cache (gateway.metering.prompt_cache).
        self._cache_reads = PromptCacheReads()

    def repriced(self, price_of: Callable[[str, str], Price | None]) -> Meter:
        """A meter at new prices (a reload) that keeps what this one learnt from providers'
        reports: each deployment's usual reasoning, each conversation's cache reads."""
        meter = Meter(price_of, self._write)
        meter._reasoning, meter._cache_reads = self._reasoning, self._cache_reads
        return meter

    def cost_of(self, route: Mapping[str, Any], usage: dict[str, Any]) -> float | None:
        """What a provider's whole usage report costs at its deployment's price (None when
        unpriced): the cost a stream's usage chunk carries to the client."""
        price = self._price_of(str(route.get("deployment")), str(route.get("model")))
        if price is None:
            return None
        if price.service_tiers:
            price = price.for_service_tier(usage.get("service_tier"))
        prompt, completion, _, cached, write_5m, write_1h = checked_counts(usage).counts
        cost = price.cost(prompt, completion, cached, write_5m, write_1h, *audio_counts(usage))
        return round(cost, 10)

    def turn(self, turn: TurnRecorder) -> dict[str, Any]:
        """Record every attempt of an ending turn; return the turn's metered totals."""
        return self._record([self._attempt(turn, attempt) for attempt in turn.attempts])

    def recovered(
        self, turn_id: str, conversation_id: str, checkpoint: dict[str, Any]
    ) -> dict[str, Any]:
        """Record the attempts of a turn closed from its last checkpoint after its process
        died (TurnRecorder.checkpoint); return its metered totals."""
        return self._record(
            [
                self._recovered(turn_id, conversation_id, checkpoint, a)
                for a in checkpoint["attempts"]
            ]
        )

    def _recovered(
        self,
        turn_id: str,
        conversation_id: str,
        checkpoint: dict[str, Any],
        attempt: dict[str, Any],
    ) -> UsageRecord:
        """An attempt's usage as its checkpoint knew it: the provider's whole count where it
        had come, else what the provider had said and a tokenizer count of what was
        delivered, the other choices of an `n > 1` stream by what they had generated, and
        hidden reasoning as `_attempt` counts it (a floor: the provider may have generated
        more before the process died)."""
        route, usage = attempt["route"], attempt["usage"]
        delivered = _tokens_of(_delivered_content(checkpoint["message"], attempt["number"]))
        # n > 1: what the other choices generated and delivered, as the checkpoint knew it.
        others = attempt.get("others")
        delivered_more = others["delivered"] if others is not None else 0
        write_5m = write_1h = 0
        deployment = str(route.get("deployment"))
        model, provider = str(route.get("model")), str(route.get("provider"))
        estimated_prompt = attempt.get("prompt_tokens") or 0
        if usage is not None and "partial" not in usage:
            source = LITELLM if usage.get("usage_source") == LITELLM else "provider"
            checked = self._checked(usage, deployment)
            prompt, completion, reasoning, cached, write_5m, write_1h = checked.counts
            if checked.wrong:
                source = CLAMPED
                if checked.prompt_wrong:
                    prompt = max(prompt, estimated_prompt)
                if checked.completion_wrong:
                    seen = delivered[0] + (others["completion"] if others is not None else 0)
                    completion = max(completion, seen)
        else:
            completion, reasoning = delivered
            choices = 1
            if others is not None:
                completion += others["completion"]
                reasoning += others["reasoning"]
                choices = others["choices"]
            prompt, cached = estimated_prompt, 0
            if usage is not None:
                checked = self._checked(usage, deployment)
                prompt, _, _, cached, write_5m, write_1h = checked.counts
                if checked.prompt_wrong:
                    prompt = max(prompt, estimated_prompt)
            source = "estimated_lower_bound"
            if checkpoint.get("reasoning") or reasons_unasked(model, provider):
                completion, reasoning = self._with_usual_reasoning(
                    deployment, completion, reasoning, choices
                )
        price = self._price_of(deployment, model)
        audio = audio_counts(usage) if usage is not None else (0, 0)
        cost = price.cost(prompt, completion, cached, write_5m, write_1h, *audio) if price else None
        # The unit prices of the tier the prompt fell in: what it was charged at.
        prices, price_source = (
            price_columns(price.at(prompt)) if price is not None else (None, None)
        )
        return UsageRecord(
            id=f"{turn_id}:{attempt['number']}",
            turn_id=turn_id,
            conversation_id=conversation_id,
            team_id=checkpoint["team_id"],
            key_id=checkpoint["key_id"],
            user=checkpoint["user"],
            alias=checkpoint["alias"],
            deployment=deployment,
            provider=provider,
            model=model,
            created_at=time.time(),
            status=attempt["outcome"] or "interrupted",
            prompt_tokens=prompt,
            completion_tokens=completion,
            completion_delivered=delivered[0] + delivered_more,
            reasoning_tokens=reasoning,
            cached_tokens=cached,
            usage_source=source,
            cost_usd=cost,
            ttft_ms=attempt["first_token_ms"],
            duration_ms=attempt["duration_ms"],
            cache_write_5m_tokens=write_5m,
            cache_write_1h_tokens=write_1h,
            audio_prompt_tokens=min(audio[0], prompt),
            audio_completion_tokens=min(audio[1], completion),
            prices=prices,
            price_source=price_source,
            tags=checkpoint.get("tags"),  # (not in an older gateway's checkpoint)
        )

    def _record(self, records: list[UsageRecord]) -> dict[str, Any]:
        for record in records:
            self._write(record)
            self._count(record)
        if len(records) == 1:  # the usual turn: its one attempt's figures are the totals
            return _totals(records[0])
        costs = [r.cost_usd for r in records if r.cost_usd is not None]
        return {
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "completion_tokens": sum(r.completion_tokens for r in records),
            "completion_delivered": sum(r.completion_delivered for r in records),
            "reasoning_tokens": sum(r.reasoning_tokens for r in records),
            "cached_tokens": sum(r.cached_tokens for r in records),
            "cache_write_5m_tokens": sum(r.cache_write_5m_tokens for r in records),
            "cache_write_1h_tokens": sum(r.cache_write_1h_tokens for r in records),
            "cost_usd": round(sum(costs), 10) if costs else None,
            # The least exact of its attempts.
            "usage_source": max(
                (r.usage_source for r in records), key=_SOURCES.index, default="provider"
            ),
        }

    def _attempt(self, turn: TurnRecorder, attempt: Attempt) -> UsageRecord:
        usage = attempt.usage
        outcome = attempt.outcome or "error"
        deployment = str(attempt.route.get("deployment"))
        write_5m = write_1h = 0
        if usage is not None and "partial" not in usage:
            source = LITELLM if usage.get("usage_source") == LITELLM else "provider"
            checked = self._checked(usage, deployment)
            prompt, completion, reasoning, cached, write_5m, write_1h = checked.counts
            if cached and outcome == "completed" and turn.lease is not None:
                self._cache_reads.reported(
                    turn.conversation_id, deployment, _extras(turn), turn.prompt, cached
                )
            if reasoning and outcome == "completed":
                self._reasoned(deployment, reasoning, other_choices(attempt.id_from))
            if checked.wrong:
                # What the provider got wrong is estimated, as if it had never said it.
                source = CLAMPED
                if checked.prompt_wrong:
                    prompt = max(prompt, _prompt_estimate(turn, attempt))
                if checked.completion_wrong:
                    generated = _generated_tokens(attempt.log.events(attempt.log.count))
                    completion = max(completion, generated[0])
                    reasoning = min(reasoning, completion)
        else:
            # The provider's whole count never came (a cancel, a cut stream): keep what it did
            # say (Anthropic's input and cache counts come first), estimate the rest.
            received = attempt.log.count
            completion, reasoning = _generated_tokens(attempt.log.events(received))
            choices = 1
            if (others := other_choices(attempt.id_from)) is not None:  # n > 1
                more, more_reasoning = others.tokens()
                completion, reasoning = completion + more, reasoning + more_reasoning
                choices = others.choices
            if usage is not None:
                checked = self._checked(usage, deployment)
                prompt, _, _, cached, write_5m, write_1h = checked.counts
                if checked.prompt_wrong:
                    prompt = max(prompt, _prompt_estimate(turn, attempt))
            else:
                billed = received or outcome != "error"  # else refused before generating
                prompt = _prompt_estimate(turn, attempt) if billed else 0
                cached = 0
                if billed and turn.lease is not None:
                    known = self._cache_reads.known(
                        turn.conversation_id, deployment, _extras(turn), turn.prompt
                    )
                    cached = min(known, prompt)
            # Reasoning the provider hides (or only summarises) is in no event received: an
            # estimate of a turn that asked for it, or of a model that reasons unasked, can
            # only be a floor. The deployment's usual reasoning, as its provider reported it,
            # is counted for the part not seen, for each choice.
            model = str(attempt.route.get("model"))
            reasons = turn.reasoning or reasons_unasked(model, str(attempt.route.get("provider")))
            source = "estimated_lower_bound" if reasons else "estimated"
            if reasons and received:
                completion, reasoning = self._with_usual_reasoning(
                    deployment, completion, reasoning, choices
                )
        if outcome == "completed":
            delivered = completion
        elif attempt.delivered:  # interrupted, or failed after part of it reached the client
            delivered = _generated_tokens(attempt.log.events(attempt.delivered))[0]
            if (others := other_choices(attempt.id_from)) is not None:  # n > 1
                delivered += others.tokens(attempt.delivered)[0]
        else:
            delivered = 0
        price = self._price_of(deployment, str(attempt.route.get("model")))
        if price is not None and price.service_tiers and usage is not None:
            price = price.for_service_tier(usage.get("service_tier"))
        audio = audio_counts(usage) if usage is not None else (0, 0)
        cost = (
            price.cost(prompt, completion, cached, write_5m, write_1h, *audio)
            if price is not None
            else None
        )
        # The unit prices of the tier the prompt fell in: what it was charged at.
        prices, price_source = (
            price_columns(price.at(prompt)) if price is not None else (None, None)
        )
        ended = attempt.ended or time.monotonic()
        return UsageRecord(
            id=f"{turn.turn_id}:{attempt.number}",
            turn_id=turn.turn_id,
            conversation_id=turn.conversation_id,
            team_id=turn.team_id,
            key_id=turn.key_id,
            user=turn.user,
            alias=turn.alias,
            deployment=deployment,
            provider=str(attempt.route.get("provider")),
            model=str(attempt.route.get("model")),
            created_at=time.time(),
            status=outcome,
            prompt_tokens=prompt,
            completion_tokens=completion,
            completion_delivered=delivered,
            reasoning_tokens=reasoning,
            cached_tokens=cached,
            usage_source=source,
            cost_usd=cost,
            ttft_ms=round(attempt.first_token_ms, 2)
            if attempt.first_token_ms is not None
            else None,
            duration_ms=round((ended - attempt.started) * 1000.0, 2),
            cache_write_5m_tokens=write_5m,
            cache_write_1h_tokens=write_1h,
            audio_prompt_tokens=min(audio[0], prompt),
            audio_completion_tokens=min(audio[1], completion),
            prices=prices,
            price_source=price_source,
            tags=turn.tags,
        )

    def _reasoned(self, deployment: str, reasoning: int, others: OtherChoices | None) -> None:
        """A whole answer's reasoning, as its provider reported it: the deployment's usual
        reasoning a choice moves toward it (an answer of several choices reports theirs
        summed; a whole answer not streamed says not how many it had, and counts as one)."""
        each = reasoning / others.choices if others is not None else reasoning
        seen = self._reasoning.get(deployment)
        self._reasoning[deployment] = (
            each if seen is None else seen + (each - seen) * _REASONING_WEIGHT
        )

    def _with_usual_reasoning(
        self, deployment: str, completion: int, reasoning: int, choices: int
    ) -> tuple[int, int]:
        """(completion, reasoning) of a cut answer of `choices` choices whose reasoning was
        partly or wholly out of sight: at least the deployment's usual reasoning a choice, for
        each; as estimated where nothing was learnt."""
        usual = self._reasoning.get(deployment)
        if usual is None:
            return completion, reasoning
        expected = round(usual * choices)
        if expected <= reasoning:
            return completion, reasoning
        return completion + expected - reasoning, expected

    @staticmethod
    def _checked(usage: dict[str, Any], deployment: str) -> CheckedCounts:
        """The provider's counts, each one it got wrong counted by field and deployment."""
        checked = checked_counts(usage)
        for name in checked.wrong:
            metrics.USAGE_CLAMPED.labels(deployment, name).inc()
        return checked

    def call(self, record: UsageRecord) -> None:
        """Write and count the usage row of an API call that is no turn
        (gateway.pipeline.calls.call_record)."""
        self._write(record)
        self._count(record)

    def _count(self, record: UsageRecord) -> None:
        key = (record.alias or "", record.deployment, record.usage_source)
        tokens, cost = self._counters.get(key) or self._counters_of(key)
        for counter, value in zip(tokens, _token_counts(record), strict=True):
            if value:
                counter.inc(value)
        if record.cost_usd:
            cost.inc(record.cost_usd)

    def _counters_of(self, key: tuple[str, str, str]) -> tuple[tuple[Any, ...], Any]:
        """A label set's token counters, one per kind, and its cost counter: looked up once
        (five lookups and their label tuples a turn, otherwise). Label sets are few: aliases
        and deployments come from the config."""
        alias, deployment, source = key
        tokens = tuple(metrics.TOKENS.labels(alias, deployment, k, source) for k in _TOKEN_KINDS)
        counters = self._counters[key] = (tokens, metrics.COST.labels(alias, deployment))
        return counters


_TOKEN_KINDS = (
    "prompt",
    "completion",
    "delivered",
    "reasoning",
    "cached",
    "cache_write_5m",
    "cache_write_1h",
)


def _token_counts(record: UsageRecord) -> tuple[int, ...]:
    """The record's counts in `_TOKEN_KINDS` order."""
    return (
        record.prompt_tokens,
        record.completion_tokens,
        record.completion_delivered,
        record.reasoning_tokens,
        record.cached_tokens,
        record.cache_write_5m_tokens,
        record.cache_write_1h_tokens,
    )
