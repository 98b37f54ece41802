"""Token estimates for when the provider's own count never came (a cancel, a cut stream).

Uses tiktoken's cl100k_base, loaded from the files litellm ships (no network); falls back to
about 4 characters a token if they are missing. An estimate is always flagged as one.

Loading the tokenizer holds the interpreter for about a tenth of a second. What a request
reserves against its limits (`tally_messages`, and the tools and schemas it sends:
`request_tokens.PromptExtras`) is counted at the same 4 characters a token until
it is loaded, its load begun on a thread of its own, rather than stall the event loop for it:
that reservation is settled by the provider's count. What a turn is billed (`count_messages`,
`count_text`) waits for the tokenizer.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import math
import os
import re
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

_UNLOADED = object()
_loaded: Any = _UNLOADED
_loading = threading.Lock()
_stopping = threading.Event()


_loader: threading.Thread | None = None


def _encoding() -> Any:
    if _loaded is _UNLOADED:
        _load()
    return _loaded


def tokenizer_ready() -> bool:
    """Whether the tokenizer is loaded (counts made now without waiting are exact)."""
    return _loaded is not _UNLOADED


def _encoding_now() -> Any:
    """The tokenizer, or None (the rough rate) while it is not loaded yet: then its load is
    begun on a thread, unless one is under way (warm(), or an estimate before)."""
    global _loader
    if _loaded is not _UNLOADED:
        return _loaded
    if (_loader is None or not _loader.is_alive()) and not _loading.locked():
        _loader = threading.Thread(target=_load, name="tokenizer-load", daemon=True)
        _loader.start()
    return None


def _load() -> None:
    global _loaded
    # One load at a time: an estimate needed while warm() is loading waits for it instead of
    # loading a second copy alongside.
    with _loading:
        if _loaded is _UNLOADED:
            _loaded = _read_encoding()


def _read_encoding() -> Any:
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations)))
        os.environ.setdefault(
            "TIKTOKEN_CACHE_DIR", str(bundled / "litellm_core_utils" / "tokenizers")
        )
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # no tokenizer files: the rough estimate below
        return None


# warm() runs on a thread started with the app. The load holds the GIL for most of its
# time, so at once it would halve the speed of the end of startup and of the first requests
# (cold start to the first answer); a moment later the gateway is usually idle.
_WARM_DELAY_S = 0.5


def warm(delay_s: float = _WARM_DELAY_S) -> None:
    """Load the tokenizer so the first estimate does not stall a request."""
    if _loaded is not _UNLOADED:  # loaded already (an earlier app in this process)
        return
    if _stopping.wait(delay_s):
        return
    _load()


def skip_warm() -> None:
    """The process is stopping: a warm() still waiting returns without loading, so a gateway
    stopped right after it started does not wait for the load. An estimate needed while
    draining loads the tokenizer itself, as any estimate before the warm-up finished does."""
    _stopping.set()


# Longer texts are estimated from a sample: tokenizing megabytes would stall the event loop
# (the estimate runs when a turn ends, inside the request's own handler). So are a prompt's
# texts past the first `_TALLY_CHARS` characters, however short each: a body of thousands of
# messages just under the sample's size would be tokenized whole.
_SAMPLE_CHARS = 8192
_TALLY_CHARS = 65536


def count_text(text: str, *, wait: bool = True) -> int:
    """`text`'s tokens; without `wait`, at the rough rate while the tokenizer is loading."""
    if not text:
        return 0
    encoding = _encoding() if wait else _encoding_now()
    if encoding is None:
        return max(1, len(text) // 4)
    if len(text) <= _SAMPLE_CHARS:
        return len(encoding.encode(text, disallowed_special=()))
    sample = len(encoding.encode(text[:_SAMPLE_CHARS], disallowed_special=()))
    return max(1, round(sample * len(text) / _SAMPLE_CHARS))


def count_messages(messages: list[Any], vendor: str = "openai", model: str | None = None) -> int:
    """A chat request's prompt tokens: text plus a few tokens of framing per message, and each
    image, audio clip or file by the rules of the `vendor` that bills it (`vendor_of`)."""
    return tally_messages(messages, wait=True).tokens(vendor, model)


def count_embedding_input(value: Any) -> int:
    """An embeddings request's `input` tokens: a text, a list of texts, a list of token ids,
    or a list of lists of them."""
    if isinstance(value, str):
        return count_text(value)
    if isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return len(value)
        return sum(count_embedding_input(v) for v in value)
    return 0


def tally_messages(messages: list[Any], *, wait: bool = False) -> PromptTally:
    """What a chat request's prompt holds, counted once: its text tokens and its other inputs,
    which each deployment's provider then prices by its own rules (`PromptTally.tokens`).
    Counted at the rough rate while the tokenizer is loading, unless `wait`."""
    tally = PromptTally(wait=wait)
    tally.text = 3
    for message in messages:
        if not isinstance(message, dict):
            continue
        tally.text += 4
        content = message.get("content")
        if isinstance(content, str):
            tally.text += tally.count(content)
        elif isinstance(content, list):
            for part in content:
                _tally_part(part, tally)
        elif content is not None:
            tally.text += _count_other(content, tally.wait)
        for call in message.get("tool_calls") or ():
            tally.text += _count_other(call, tally.wait)
    return tally


# -- inputs other than text ----------------------------------------------------------------------
#
# Base64 is never counted as text: an image, audio clip or file is priced by what its provider
# says it costs. Sizes are read from the data's own header (PNG, JPEG, GIF, WebP; WAV, MP3;
# PDF pages), decoding only the bytes needed; where they cannot be read (a remote URL, a file
# id, a format not recognised) the largest the rule allows is assumed, so a reservation made
# from the estimate still holds. Every count here is an estimate, as any count of this module
# is (a usage record made from one says `usage_source: "estimated"`).


@dataclass
class Image:
    width: int | None  # None: not known (a remote URL, an unreadable header)
    height: int | None
    detail: str  # low | high | auto


@dataclass
class Audio:
    seconds: float


@dataclass
class File:
    pages: int  # a PDF's, else an estimate from its size
    text_tokens: int  # a text file's own tokens (0 for a PDF)


@dataclass
class PromptTally:
    text: int = 0
    media: list[Image | Audio | File] = field(default_factory=list)
    # The characters of text counted so far, and their tokens: past `_TALLY_CHARS` the rest
    # is counted at their rate, as one long text is from its sample (`count_text`).
    chars: int = 0
    counted: int = 0
    wait: bool = True  # for the tokenizer, were it not loaded yet (`count_text`)

    def count(self, text: str) -> int:
        """`count_text`, for one text of many in a prompt."""
        if self.chars >= _TALLY_CHARS and self.counted:
            return max(1, round(len(text) * self.counted / self.chars)) if text else 0
        tokens = count_text(text, wait=self.wait)
        self.chars += len(text)
        self.counted += tokens
        return tokens

    def tokens(self, vendor: str = "openai", model: str | None = None) -> int:
        total = self.text
        for item in self.media:
            if isinstance(item, Image):
                total += image_tokens(item, vendor, model)
            elif isinstance(item, Audio):
                rate = GEMINI_AUDIO_PER_S if vendor == "gemini" else OPENAI_AUDIO_PER_S
                total += math.ceil(item.seconds * rate)
            else:
                total += item.text_tokens + item.pages * PDF_PAGE_TOKENS
        return total


def vendor_of(provider: str, model: str) -> str:
    """Whose rules price a deployment's non-text input: `anthropic`, `gemini` or `openai`."""
    name = model.lower()
    if provider == "anthropic" or "claude" in name:
        return "anthropic"
    if "gemini" in name:
        return "gemini"
    return "openai"


# OpenAI (platform.openai.com/docs/guides/images-vision, "Calculating costs"), read in 2025:
# - tile models: `detail: low` costs the base tokens; `high` and `auto` scale the image to fit
#   in 2048 x 2048, then (only ever down) so that its shortest side is 768 px, and cost the
#   base plus a tile price per 512 px square covering it. GPT-4o, GPT-4.1, GPT-4.5, GPT-5 and
#   most others: 85 + 170 a tile; gpt-4o-mini: 2,833 + 5,667; o1, o3: 75 + 150.
# - patch models (gpt-4.1-mini and -nano, o4-mini, gpt-5-mini and -nano): 32 px patches
#   covering the image, at most 1,536 (a larger image is scaled down to fit), times a
#   per-model multiplier; detail does not change it.
_TILE_MODELS = (("gpt-4o-mini", 2833, 5667), ("o1", 75, 150), ("o3", 75, 150))
_PATCH_MODELS = (
    ("gpt-4.1-mini", 1.62),
    ("gpt-4.1-nano", 2.46),
    ("gpt-5-mini", 1.62),
    ("gpt-5-nano", 2.46),
    ("o4-mini", 1.72),
)
# Anthropic (docs.anthropic.com, "Vision", "Evaluate image size"), read in 2025: an image whose
# long edge passes 1,568 px or that would cost more than about 1,600 tokens is first scaled
# down, keeping its aspect ratio; it then costs width * height / 750 tokens.
ANTHROPIC_LONG_EDGE = 1568
ANTHROPIC_MAX_IMAGE_TOKENS = 1600
# Gemini (ai.google.dev, "Understand and count tokens"): 258 tokens for an image of at most
# 384 px a side, else 258 for each 768 px tile covering it; audio at 32 tokens a second.
GEMINI_AUDIO_PER_S = 32
# OpenAI's audio input (the Realtime API's documented rate, which its audio chat models share):
# one token per 100 ms.
OPENAI_AUDIO_PER_S = 10
# A PDF page: Anthropic documents 1,500 to 3,000 text tokens a page, and both providers add
# an image of each page; the upper end is taken.
PDF_PAGE_TOKENS = 3000
# An image whose size cannot be read is assumed to be the largest a rule bills: 2048 x 768
# covers 8 tiles after OpenAI's scaling, the most any image can.
_UNKNOWN_SIZE = (768, 2048)


def image_tokens(image: Image, vendor: str = "openai", model: str | None = None) -> int:
    width, height = image.width, image.height
    if vendor == "anthropic":
        if not width or not height:
            return ANTHROPIC_MAX_IMAGE_TOKENS
        scale = min(
            1.0,
            ANTHROPIC_LONG_EDGE / max(width, height),
            math.sqrt(ANTHROPIC_MAX_IMAGE_TOKENS * 750 / (width * height)),
        )
        width, height = max(1, int(width * scale)), max(1, int(height * scale))
        return min(ANTHROPIC_MAX_IMAGE_TOKENS, math.ceil(width * height / 750))
    if vendor == "gemini":
        if not width or not height:
            width, height = _UNKNOWN_SIZE
        if width <= 384 and height <= 384:
            return 258
        return 258 * math.ceil(width / 768) * math.ceil(height / 768)
    name = (model or "").lower().rsplit("/", 1)[-1]
    for prefix, multiplier in _PATCH_MODELS:
        if name.startswith(prefix):
            return math.ceil(_patches(width, height) * multiplier)
    base, tile = 85, 170
    for prefix, model_base, model_tile in _TILE_MODELS:
        if name == prefix or name.startswith(prefix + "-"):
            base, tile = model_base, model_tile
            break
    if image.detail == "low":
        return base
    if not width or not height:
        width, height = _UNKNOWN_SIZE
    fit = min(1.0, 2048 / max(width, height))  # into 2048 x 2048
    fit *= min(1.0, 768 / (min(width, height) * fit))  # then the shortest side to 768
    # (Rounded first, so that a side of exactly 1,536 px is three tiles, not 3.0000001.)
    tiles = math.ceil(round(width * fit, 6) / 512) * math.ceil(round(height * fit, 6) / 512)
    return base + tile * tiles


def _patches(width: int | None, height: int | None) -> int:
    if not width or not height:
        return 1536
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches <= 1536:
        return patches
    shrink = math.sqrt(32 * 32 * 1536 / (width * height))
    w, h = width * shrink / 32, height * shrink / 32
    shrink *= min(math.floor(w) / w, math.floor(h) / h)
    return min(1536, math.ceil(width * shrink / 32) * math.ceil(height * shrink / 32))


def _tally_part(part: Any, tally: PromptTally) -> None:
    if not isinstance(part, dict):
        tally.text += _count_other(part, tally.wait)
        return
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        tally.text += tally.count(part["text"])
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail") if isinstance(image, dict) else None
        size = _image_size(url) if isinstance(url, str) else None
        width, height = size or (None, None)
        tally.media.append(Image(width, height, detail if isinstance(detail, str) else "auto"))
    elif kind == "input_audio":
        audio = part.get("input_audio")
        audio = audio if isinstance(audio, dict) else {}
        data = audio.get("data")
        tally.media.append(Audio(_audio_seconds(data, audio.get("format"))))
    elif kind == "file":
        file = part.get("file")
        tally.media.append(_file(file if isinstance(file, dict) else {}, tally.wait))
    else:
        tally.text += _count_other(part, tally.wait)


def _count_other(value: Any, wait: bool = True) -> int:
    """A value of no known shape: its text, without any base64 it carries."""
    return count_text(orjson.dumps(_without_blobs(value)).decode(), wait=wait)


def _without_blobs(value: Any) -> Any:
    if isinstance(value, str):
        return "" if _is_blob(value) else value
    if isinstance(value, dict):
        return {k: _without_blobs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_blobs(v) for v in value]
    return value


_BASE64 = re.compile(rb"[A-Za-z0-9+/=_\-\s]+")


def _is_blob(text: str) -> bool:
    if text.startswith("data:") and ";base64," in text[:200]:
        return True
    if len(text) < 256 or " " in text[:256]:
        return False
    return _BASE64.fullmatch(text[:4096].encode(errors="replace")) is not None


def _data(url: str, head: int | None = None) -> bytes | None:
    """The bytes of a base64 data URL (the first `head` of them at least, when given)."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    text = url[comma + 1 :] if head is None else url[comma + 1 : comma + 1 + (head * 4 // 3 + 4)]
    return _b64(text)


def _b64(text: str) -> bytes | None:
    text = "".join(text.split()) if " " in text[:100] or "\n" in text[:5000] else text
    text = text[: len(text) - len(text) % 4]
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"))
    except (ValueError, binascii.Error):
        return None


def _image_size(url: str) -> tuple[int, int] | None:
    """An image's width and height from its data URL's header; None for a remote URL."""
    head = _data(url, 64 * 1024)
    if head is None:
        return None
    size = image_size(head)
    if size is None and head[:2] == b"\xff\xd8":  # a JPEG whose frame header comes later
        whole = _data(url)
        size = image_size(whole) if whole else None
    return size


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, JPEG, GIF or WebP from its header, else None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
            width, height = struct.unpack("<HH", data[26:30])
            return width & 0x3FFF, height & 0x3FFF
        if chunk == b"VP8L" and data[20:21] == b"\x2f":
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            width = int.from_bytes(data[24:27], "little") + 1
            height = int.from_bytes(data[27:30], "little") + 1
            return width, height
        return None
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


# JPEG start-of-frame markers: baseline, progressive and the rarer codings (not DHT, JPG, DAC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _audio_seconds(data: Any, fmt: Any) -> float:
    """An audio clip's length: a WAV's from its header, an MP3's from its first frame's bit
    rate, anything else at 128 kbit/s."""
    if not isinstance(data, str) or not data:
        return 0.0
    size = len(data) * 3 // 4
    head = _b64(data[:8192]) or b""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and len(head) >= 32:
        byte_rate = int.from_bytes(head[28:32], "little")
        if byte_rate > 0:
            return max(0, size - 44) / byte_rate
    bitrate = _mp3_bitrate(head) if fmt in ("mp3", None) or head[:3] == b"ID3" else None
    return size * 8 / (bitrate or 128_000)


def audio_seconds(data: bytes, filename: str) -> float | None:
    """An audio file's length, from a WAV's header or an MP3's first frame's bit rate; None
    for any other kind (the gateway reads no other container)."""
    head = data[:8192]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and len(head) >= 32:
        byte_rate = int.from_bytes(head[28:32], "little")
        return max(0, len(data) - 44) / byte_rate if byte_rate > 0 else None
    if head[:3] == b"ID3" or filename.lower().endswith(".mp3"):
        bitrate = _mp3_bitrate(head)
        return len(data) * 8 / bitrate if bitrate else None
    return None


# MPEG audio layer III bit rates (kbit/s) by bit-rate index: MPEG-1, then MPEG-2 and 2.5.
_MP3_RATES = (
    (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
)


def _mp3_bitrate(head: bytes) -> int | None:
    at = 0
    if head[:3] == b"ID3" and len(head) >= 10:  # skip the tag: its size is 4 x 7 bits
        at = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10]))
    for i in range(at, min(len(head) - 3, at + 4096)):
        if head[i] == 0xFF and head[i + 1] & 0xE6 == 0xE2:  # frame sync, layer III
            version = (head[i + 1] >> 3) & 0x3
            index = head[i + 2] >> 4
            if 0 < index < 15 and version != 1:
                return _MP3_RATES[0 if version == 3 else 1][index] * 1000
    return None


_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
# A PDF whose page objects are compressed out of sight: about one page per this many bytes.
_PDF_BYTES_PER_PAGE = 50_000


def _file(file: dict[str, Any], wait: bool = True) -> File:
    data = file.get("file_data")
    if not isinstance(data, str):
        return File(pages=1, text_tokens=0)  # a file id: its contents are not in the request
    raw = _data(data) if data.startswith("data:") else _b64(data)
    if raw is None:
        return File(pages=1, text_tokens=0)
    if raw[:5] == b"%PDF-":
        pages = len(_PDF_PAGE.findall(raw)) or max(1, len(raw) // _PDF_BYTES_PER_PAGE)
        return File(pages=pages, text_tokens=0)
    try:
        return File(pages=0, text_tokens=count_text(raw.decode(), wait=wait))
    except UnicodeDecodeError:
        return File(pages=max(1, len(raw) // _PDF_BYTES_PER_PAGE), text_tokens=0)
