"""Images, audio and files in a prompt are estimated by the rules of the provider that bills
them, their size read from the data's own header; base64 is never counted as text."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import zlib
from typing import Any

import aiohttp
import pytest

from gateway.metering.tokens import (
    Image,
    count_messages,
    count_text,
    image_size,
    image_tokens,
    tally_messages,
)
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

MASTER = "master-key-for-tests-0123456789"
QUESTION = "What is in this image?"


def png(width: int, height: int, payload: int = 0) -> bytes:
    """A PNG with this size; `payload` random bytes stand for its compressed pixels."""

    def part(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + part(b"IHDR", header)
        + part(b"IDAT", os.urandom(payload))
        + part(b"IEND", b"")
    )


def jpeg(width: int, height: int) -> bytes:
    """A JPEG's head: SOI, an APP0 (JFIF) segment, then the baseline frame header."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return (
        b"\xff\xd8"
        + b"\xff\xe0"
        + struct.pack(">H", len(app0) + 2)
        + app0
        + b"\xff\xc0"
        + struct.pack(">H", len(sof) + 2)
        + sof
        + b"\xff\xd9"
    )


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_message(url: str, detail: str | None = None) -> list[dict[str, Any]]:
    image: dict[str, Any] = {"url": url}
    if detail is not None:
        image["detail"] = detail
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": image}]
    return [{"role": "user", "content": content}]


TEXT = 3 + 4 + count_text(QUESTION)  # the framing of one message, and its text


def test_openai_tiles_as_documented() -> None:
    # OpenAI's own examples: 1024 x 1024 at high detail is scaled to 768 x 768, four 512 px
    # tiles: 85 + 4 * 170; 2048 x 4096 to 768 x 1536, six: 85 + 6 * 170; low is 85 whatever
    # the size.
    big = data_url(png(1024, 1024, payload=200_000))
    assert len(big) > 260_000
    assert count_messages(image_message(big, "high")) == TEXT + 765
    assert count_messages(image_message(big)) == TEXT + 765  # auto: as high
    assert count_messages(image_message(big, "low")) == TEXT + 85
    assert count_messages(image_message(data_url(png(2048, 4096)), "high")) == TEXT + 1105
    assert count_messages(image_message(data_url(png(4096, 8192)), "low")) == TEXT + 85
    # Small images are not scaled up: 128 x 64 is one tile.
    assert count_messages(image_message(data_url(png(128, 64)))) == TEXT + 255
    # A JPEG's size is read from its frame header: 1920 x 1080 -> 1365 x 768, 3 x 2 tiles.
    photo = data_url(jpeg(1920, 1080), "image/jpeg")
    assert count_messages(image_message(photo)) == TEXT + 85 + 6 * 170
    # A remote image's size is unknown: the most any image costs, 2048 x 768 (8 tiles).
    assert count_messages(image_message("https://example.com/cat.png")) == TEXT + 85 + 8 * 170


def test_per_model_and_per_provider_rules() -> None:
    square = Image(1024, 1024, "high")
    assert image_tokens(square, model="gpt-4o-mini") == 2833 + 4 * 5667
    assert image_tokens(Image(1024, 1024, "low"), model="gpt-4o-mini") == 2833
    assert image_tokens(square, model="o1") == 75 + 4 * 150
    # Patch models: 32 px patches, at most 1,536, times the model's multiplier. OpenAI's
    # example: 1800 x 2400 is scaled to 1,452 patches.
    assert image_tokens(Image(1800, 2400, "high"), model="gpt-4.1-mini") == 2353  # 1452 * 1.62
    assert image_tokens(square, model="gpt-4.1-nano") == 2520  # 1024 * 2.46, rounded up
    # Anthropic: width * height / 750, after scaling to a long edge of 1568 and ~1,600 tokens.
    assert image_tokens(Image(200, 200, "auto"), "anthropic") == 54  # 40,000 / 750
    assert image_tokens(Image(1092, 1092, "auto"), "anthropic") == 1590
    assert image_tokens(Image(4000, 3000, "auto"), "anthropic") <= 1600
    assert image_tokens(Image(None, None, "auto"), "anthropic") == 1600
    # Gemini: 258 up to 384 px a side, else 258 per 768 px tile.
    assert image_tokens(Image(300, 300, "auto"), "gemini") == 258
    assert image_tokens(Image(1024, 1024, "auto"), "gemini") == 4 * 258


def test_image_headers() -> None:
    assert image_size(png(640, 480)) == (640, 480)
    assert image_size(jpeg(1920, 1080)) == (1920, 1080)
    assert image_size(b"GIF89a" + struct.pack("<HH", 320, 200) + b"\x00" * 8) == (320, 200)
    vp8x = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00"
    vp8x += (799).to_bytes(3, "little") + (599).to_bytes(3, "little")
    assert image_size(vp8x) == (800, 600)
    assert image_size(b"not an image at all") is None


def test_audio_files_and_stray_base64_are_not_text() -> None:
    # Two seconds of 16 kHz mono 16-bit WAV: OpenAI counts audio at 10 tokens a second.
    pcm = b"\x00\x00" * 32_000
    wav = (
        b"RIFF"
        + struct.pack("<I", 36 + len(pcm))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, 16_000, 32_000, 2, 16)
        + b"data"
        + struct.pack("<I", len(pcm))
        + pcm
    )
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode()}}
    assert count_messages([{"role": "user", "content": [audio]}]) == 3 + 4 + 20
    assert tally_messages([{"role": "user", "content": [audio]}]).tokens("gemini") == 3 + 4 + 64
    # A three-page PDF: 3,000 tokens a page.
    pdf = b"%PDF-1.4\n" + b"".join(b"<< /Type /Page /Parent 2 0 R >>\n" for _ in range(3))
    pdf += b"<< /Type /Pages /Count 3 >>\n" + os.urandom(5000)
    file = {"type": "file", "file": {"file_data": data_url(pdf, "application/pdf")}}
    assert count_messages([{"role": "user", "content": [file]}]) == 3 + 4 + 9000
    # A part of a type not known here: its text counts, its base64 does not.
    blob = base64.b64encode(os.urandom(100_000)).decode()
    other = {"type": "input_video", "video": {"data": blob, "caption": "hello"}}
    assert count_messages([{"role": "user", "content": [other]}]) < 40


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_image_prompt_is_reserved_and_estimated_by_its_providers_rule(
    make_gateway: MakeGateway, upstream: FakeUpstream, provider: str
) -> None:
    """End to end: a 270 KB base64 PNG (it used to count as ~140,000 tokens of text) is
    reserved at 765 tokens on an OpenAI deployment, or 1,399 (1024 * 1024 / 750) when the
    request may reach an Anthropic one, and a stream cut before any usage came is billed by
    the same estimate."""
    price = {"input_cost_per_mtok": 1.0, "output_cost_per_mtok": 5.0}
    deployments = [upstream.deployment(name="openai-d", **price)]
    if provider == "anthropic":
        # Never reached (it comes second), but the reservation is for the priciest route.
        deployments.append(
            {
                "provider": "anthropic",
                "name": "claude-d",
                "model": "claude-3-5-haiku-20241022",
                "api_base": upstream.url,
                "priority": 1,
                "input_cost_per_mtok": 2.0,
                "output_cost_per_mtok": 5.0,
            }
        )
    models = [{"name": "fake", "retry": {"max_attempts": 1}, "deployments": deployments}]
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        team = {"id": "t", "name": "T", "limits": {"budget": {"usd": 10, "period": "day"}}}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201
        async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as r:
            key = (await r.json())["key"]
    messages = image_message(data_url(png(1024, 1024, payload=200_000)))
    upstream.cut_after(["A cat"])
    body = {"model": "fake", "messages": messages, "max_tokens": 100, "stream": True}

    async def ask() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.post(gw.url + "/v1/chat/completions", json=body) as r,
        ):
            assert r.status == 200
            await r.read()

    task = asyncio.create_task(ask())
    await asyncio.wait_for(upstream.stalled.wait(), 10)
    reserved = gw.gateway.limiter.held("team", "t").reserved
    if provider == "openai":
        assert reserved == pytest.approx((TEXT + 765) * 1e-6 + 100 * 5e-6)
    else:
        assert reserved == pytest.approx((TEXT + 1399) * 2e-6 + 100 * 5e-6)
    upstream.release.set()
    await task
    await gw.flush()
    [(prompt, source)] = gw.query("SELECT prompt_tokens, usage_source FROM usage")
    assert (prompt, source) == (TEXT + 765, "estimated")  # billed by the OpenAI deployment
