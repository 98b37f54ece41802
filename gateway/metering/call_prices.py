"""What an API call that is not a chat costs: images, audio, moderations, rerank, batches.

Each is billed by its own unit, at the price litellm's map (or the operator's price file, or the
deployment's `price`) gives the model actually sent:

- **images**: the provider's token count where the answer has one (`gpt-image-1`: text and
  image input tokens, image output tokens, each at its price); else per image by size and
  quality (the map's `{quality}/{W}-x-{H}/{model}` entries: `input_cost_per_image`, or per
  pixel), else the model's own `output_cost_per_image` / `input_cost_per_image`;
- **transcriptions and translations**: the provider's token count (`gpt-4o-transcribe`: audio
  and text input tokens, output tokens), else the audio's seconds (the answer's `usage` or
  `duration`, else read from a WAV or MP3 file's header) at `input_cost_per_second`;
- **speech**: the input's characters at `input_cost_per_character`, else its tokens at
  `input_cost_per_token` and the answer's seconds (read from WAV or MP3) at
  `output_cost_per_second`;
- **moderations**: free unless priced (`input_cost_per_token` over the input's tokens);
- **rerank**: per search (Cohere's `meta.billed_units.search_units`, else one per 100
  documents) at `input_cost_per_query`;
- **batches**: each request's tokens at the batch prices (`input_cost_per_token_batches`,
  `output_cost_per_token_batches`; the plain ones where the map has none).

A price that cannot be found leaves the call unpriced (`cost` None), as for a completion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.metering.prices import candidates, price_map
from gateway.metering.tokens import audio_seconds, count_text

MAX_IMAGES = 10  # OpenAI's most a request may ask for


@dataclass
class Bill:
    """What a call was billed by, and its cost (None: unpriced)."""

    units: dict[str, Any]
    cost: float | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    source: str = "provider"  # provider | estimated
    # The unit prices and their source, where one token price made the cost (embeddings):
    # the usage row's `prices` and `price_source` (gateway.metering.prices.price_columns).
    prices: str | None = None
    price_source: str | None = None


def _number(entry: Mapping[str, Any] | None, name: str) -> float | None:
    value = (entry or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _seconds(value: Any) -> float | None:
    """A length the provider reported, None unless it is one (a negative or NaN length would
    bill a negative cost)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


@dataclass
class CallPrices:
    """The price entries of one model sent to one deployment: its config's own, else the
    price file's, else the map's; `free` prices everything at 0."""

    model: str
    provider: str
    own: dict[str, Any] | None = None  # the deployment's `price` fields
    file: Mapping[str, Any] | None = None
    free: bool = False
    _cache: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def entry(self, prefix: str = "") -> dict[str, Any] | None:
        """The entry for the model (`prefix/model` where a size or quality names it)."""
        if not prefix and self.own is not None:
            return self.own
        if prefix in self._cache:
            return self._cache[prefix]
        found = None
        for table in (self.file, price_map()):
            for name, _ in candidates(self.model, self.provider):
                entry = (table or {}).get(f"{prefix}/{name}" if prefix else name)
                if isinstance(entry, dict):
                    found = entry
                    break
            if found is not None:
                break
        self._cache[prefix] = found
        return found

    def price(self, name: str, prefix: str = "") -> float | None:
        return 0.0 if self.free else _number(self.entry(prefix), name)


def _sum(*parts: float | None) -> float | None:
    """A cost of several parts; None when one part is unpriced."""
    if any(p is None for p in parts):
        return None
    return round(sum(p for p in parts if p is not None), 10)


# -- images ---------------------------------------------------------------------------------------


def _size(size: Any) -> tuple[int, int] | None:
    if isinstance(size, str) and "x" in size:
        width, _, height = size.partition("x")
        if width.isdigit() and height.isdigit():
            return int(width), int(height)
    return None


def image_price(prices: CallPrices, size: Any, quality: Any) -> float | None:
    """One image's price by size and quality, else the model's own per-image price."""
    dims = _size(size)
    qualities = [quality] if isinstance(quality, str) and quality != "auto" else []
    # Unsaid (or `auto`), the dearest quality the map knows: what the image may cost.
    qualities += ["standard", "hd", "high", "medium", "low"] if not qualities else []
    if dims is not None:
        width, height = dims
        sized = f"{width}-x-{height}"
        found = []
        for q in qualities:
            per_image = image_entry_price(prices, f"{q}/{sized}", width * height)
            if per_image is not None:
                found.append(per_image)
                if isinstance(quality, str) and quality != "auto":
                    break
        if found:
            return max(found)
        per_image = image_entry_price(prices, sized, width * height)
        if per_image is not None:
            return per_image
    for name in ("output_cost_per_image", "input_cost_per_image"):
        price = prices.price(name)
        if price is not None:
            return price
    return None


def image_entry_price(prices: CallPrices, prefix: str, pixels: int) -> float | None:
    if prices.free:
        return 0.0
    entry = prices.entry(prefix)
    if entry is None:
        return None
    per_image = _number(entry, "input_cost_per_image")
    if per_image is not None:
        return per_image
    per_pixel = _number(entry, "input_cost_per_pixel")
    if per_pixel is None:
        return None
    return per_pixel * pixels + (_number(entry, "output_cost_per_pixel") or 0.0) * pixels


def images_bill(prices: CallPrices, fields: Mapping[str, Any], answer: Any) -> Bill:
    data = answer.get("data") if isinstance(answer, dict) else None
    count = len(data) if isinstance(data, list) else 0
    size, quality = fields.get("size"), fields.get("quality")
    units: dict[str, Any] = {"images": count, "size": size, "quality": quality}
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(usage, dict) and (
        _int(usage.get("output_tokens")) or _int(usage.get("input_tokens"))
    ):
        details = usage.get("input_tokens_details")
        details = details if isinstance(details, dict) else {}
        image_in = _int(details.get("image_tokens"))
        text_in = _int(details.get("text_tokens")) or max(
            0, _int(usage.get("input_tokens")) - image_in
        )
        out = _int(usage.get("output_tokens"))
        cost = _sum(
            text_in * (prices.price("input_cost_per_token") or 0.0),
            image_in
            * (
                prices.price("input_cost_per_image_token")
                or prices.price("input_cost_per_token")
                or 0.0
            ),
            out * p
            if (
                p := prices.price("output_cost_per_image_token")
                or prices.price("output_cost_per_token")
            )
            is not None
            else None,
        )
        if cost is not None:
            return Bill(units, cost, text_in + image_in, out)
    per_image = image_price(prices, size, quality)
    return Bill(units, None if per_image is None else round(per_image * count, 10))


def images_estimate(prices: CallPrices, fields: Mapping[str, Any]) -> float | None:
    n = fields.get("n")
    count = int(n) if isinstance(n, int | str) and str(n).isdigit() else 1
    per_image = image_price(prices, fields.get("size") or "1024x1024", fields.get("quality"))
    return None if per_image is None else per_image * max(1, min(count, MAX_IMAGES))


# -- audio ----------------------------------------------------------------------------------------


def transcription_bill(prices: CallPrices, audio: bytes, filename: str, answer: Any) -> Bill:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(usage, dict) and usage.get("type") == "tokens":
        details = usage.get("input_token_details")
        details = details if isinstance(details, dict) else {}
        audio_in = _int(details.get("audio_tokens"))
        text_in = _int(details.get("text_tokens")) or max(
            0, _int(usage.get("input_tokens")) - audio_in
        )
        out = _int(usage.get("output_tokens"))
        cost = _sum(
            audio_in * p
            if (
                p := prices.price("input_cost_per_audio_token")
                or prices.price("input_cost_per_token")
            )
            is not None
            else None,
            text_in * (prices.price("input_cost_per_token") or 0.0),
            out * (prices.price("output_cost_per_token") or 0.0),
        )
        return Bill({"audio_tokens": audio_in}, cost, audio_in + text_in, out)
    source = "provider"
    seconds = _seconds(usage.get("seconds")) if isinstance(usage, dict) else None
    if seconds is None and isinstance(answer, dict):
        seconds = _seconds(answer.get("duration"))
    if seconds is None:
        seconds, source = audio_seconds(audio, filename), "estimated"
    price = prices.price("input_cost_per_second")
    cost = None if price is None or seconds is None else round(price * seconds, 10)
    return Bill(
        {"seconds": round(seconds, 3) if seconds is not None else None}, cost, source=source
    )


def transcription_estimate(prices: CallPrices, audio: bytes, filename: str) -> float | None:
    seconds = audio_seconds(audio, filename)
    per_second = prices.price("input_cost_per_second")
    if per_second is not None and seconds is not None:
        return per_second * seconds
    per_token = prices.price("input_cost_per_audio_token") or prices.price("input_cost_per_token")
    if per_token is not None and seconds is not None:
        # OpenAI's audio input is about 10 tokens a second; the text out, a few a second.
        return (
            per_token * seconds * 10 + (prices.price("output_cost_per_token") or 0.0) * seconds * 5
        )
    return None


def speech_bill(prices: CallPrices, text: str, audio: bytes, fmt: str) -> Bill:
    characters = len(text)
    per_character = prices.price("input_cost_per_character")
    if per_character is not None:
        return Bill({"characters": characters}, round(per_character * characters, 10))
    tokens = count_text(text)
    seconds = audio_seconds(audio, f"speech.{fmt}")
    cost = _sum(
        tokens * p if (p := prices.price("input_cost_per_token")) is not None else None,
        seconds * p
        if (p := prices.price("output_cost_per_second")) is not None and seconds is not None
        else None,
    )
    units = {"characters": characters, "seconds": round(seconds, 3) if seconds else None}
    return Bill(units, cost, tokens, source="estimated")


def speech_estimate(prices: CallPrices, text: str) -> float | None:
    per_character = prices.price("input_cost_per_character")
    if per_character is not None:
        return per_character * len(text)
    per_second = prices.price("output_cost_per_second")
    if per_second is None:
        return None
    # About 15 characters a second of speech; the text's tokens besides.
    return per_second * len(text) / 15 + (prices.price("input_cost_per_token") or 0.0) * count_text(
        text
    )


# -- moderations and rerank -----------------------------------------------------------------------


def moderation_bill(prices: CallPrices, inputs: Any) -> Bill:
    tokens = _tokens_of(inputs)
    price = prices.price("input_cost_per_token") or 0.0  # free unless priced
    return Bill(
        {"inputs": len(inputs) if isinstance(inputs, list) else 1},
        round(price * tokens, 10),
        tokens,
        source="estimated",
    )


def _tokens_of(value: Any) -> int:
    if isinstance(value, str):
        return count_text(value)
    if isinstance(value, list):
        return sum(_tokens_of(v) for v in value)
    if isinstance(value, dict):
        return count_text(value["text"]) if isinstance(value.get("text"), str) else 0
    return 0


def searches(documents: int) -> int:
    """Cohere's search units: one per 100 documents."""
    return max(1, math.ceil(documents / 100))


def rerank_bill(prices: CallPrices, documents: int, answer: Any) -> Bill:
    meta = answer.get("meta") if isinstance(answer, dict) else None
    billed = meta.get("billed_units") if isinstance(meta, dict) else None
    units = _int(billed.get("search_units")) if isinstance(billed, dict) else 0
    source = "provider" if units else "estimated"
    units = units or searches(documents)
    price = prices.price("input_cost_per_query")
    cost = None if price is None else round(price * units, 10)
    return Bill({"searches": units, "documents": documents}, cost, source=source)


def rerank_estimate(prices: CallPrices, documents: int) -> float | None:
    price = prices.price("input_cost_per_query")
    return None if price is None else price * searches(documents)


# -- batches --------------------------------------------------------------------------------------


def batch_bill(prices: CallPrices, prompt: int, completion: int, requests: int) -> Bill:
    """A batch's requests' tokens at the batch prices (the plain ones where none is given)."""
    input_price = prices.price("input_cost_per_token_batches")
    if input_price is None:
        input_price = prices.price("input_cost_per_token")
    output_price = prices.price("output_cost_per_token_batches")
    if output_price is None:
        output_price = prices.price("output_cost_per_token")
    cost = _sum(
        None if input_price is None else input_price * prompt,
        None if output_price is None else output_price * completion,
    )
    return Bill({"requests": requests}, cost, prompt, completion)
