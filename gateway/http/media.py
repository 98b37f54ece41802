"""The OpenAI API's other model calls, and rerank: images, audio, moderations.

Each handler checks what the gateway routes and bills by, and hands the call to
gateway.pipeline.calls (admitted, routed, metered, in the request log; the answer unchanged):

- `POST /v1/images/generations` (JSON), `/v1/images/edits` and `/v1/images/variations`
  (multipart): per image, by size and quality;
- `POST /v1/audio/transcriptions` and `/v1/audio/translations` (multipart): per second of audio,
  or per audio token; `POST /v1/audio/speech` (JSON): the audio relayed as it comes, per
  character of input;
- `POST /v1/moderations`: free unless priced;
- `POST /v1/rerank`, the Cohere/Jina shape (`{model, query, documents, top_n}` ->
  `{results: [{index, relevance_score}]}`): per search.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.requests import parse_json_object
from gateway.errors import InvalidRequest
from gateway.forms import Form, read_form
from gateway.http.auth import PRINCIPAL
from gateway.metering import call_prices as bills
from gateway.pipeline.calls import Call, run_call

# OpenAI's model when a moderation names none: an alias (or a pattern) of that name serves it.
DEFAULT_MODERATION_MODEL = "omni-moderation-latest"


def _text(body: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{name}' must be a non-empty string.", param=name)
    return value


def _count(value: Any, name: str, most: int) -> None:
    if value is None:
        return
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or str(value).strip() != str(number) or not 1 <= number <= most:
        raise InvalidRequest(f"'{name}' must be an integer from 1 to {most}.", param=name)


def _user(value: Any) -> str | None:
    return value if isinstance(value, str) and "\x00" not in value else None


async def _run(request: web.Request, call: Call) -> web.StreamResponse:
    return await run_call(request.app[GATEWAY], request, request[PRINCIPAL], call)


async def _form(request: web.Request) -> Form:
    limit = int(request.app[GATEWAY].config.server.max_upload_mb * 1024 * 1024)
    return await read_form(request, limit)


def _form_model(form: Form) -> str:
    model = form.value("model")
    if not model:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    return model


# -- images ---------------------------------------------------------------------------------------


async def images_generations(request: web.Request) -> web.StreamResponse:
    body = parse_json_object(await request.read())
    model = _text(body, "model")
    _text(body, "prompt")
    _count(body.get("n"), "n", bills.MAX_IMAGES)
    fields = {k: body.get(k) for k in ("n", "size", "quality")}
    assert model is not None
    return await _run(
        request,
        Call(
            "images.generations",
            "/images/generations",
            model,
            json=body,
            user=_user(body.get("user")),
            estimate=lambda prices: bills.images_estimate(prices, fields),
            bill=lambda prices, raw, answer: bills.images_bill(prices, fields, answer),
        ),
    )


async def images_edits(request: web.Request) -> web.StreamResponse:
    return await _image_form(request, "images.edits", "/images/edits", prompt=True)


async def images_variations(request: web.Request) -> web.StreamResponse:
    return await _image_form(request, "images.variations", "/images/variations", prompt=False)


async def _image_form(
    request: web.Request, endpoint: str, path: str, *, prompt: bool
) -> web.StreamResponse:
    form = await _form(request)
    model = _form_model(form)
    if not any(p.filename is not None and p.name in ("image", "image[]") for p in form.parts):
        raise InvalidRequest("Missing required file: 'image'.", param="image")
    if prompt and not form.value("prompt"):
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt")
    _count(form.value("n"), "n", bills.MAX_IMAGES)
    fields = {k: form.value(k) for k in ("n", "size", "quality")}
    return await _run(
        request,
        Call(
            endpoint,
            path,
            model,
            form=form,
            user=_user(form.value("user")),
            estimate=lambda prices: bills.images_estimate(prices, fields),
            bill=lambda prices, raw, answer: bills.images_bill(prices, fields, answer),
        ),
    )


# -- audio ----------------------------------------------------------------------------------------


async def audio_transcriptions(request: web.Request) -> web.StreamResponse:
    return await _audio_form(request, "audio.transcriptions", "/audio/transcriptions")


async def audio_translations(request: web.Request) -> web.StreamResponse:
    return await _audio_form(request, "audio.translations", "/audio/translations")


async def _audio_form(request: web.Request, endpoint: str, path: str) -> web.StreamResponse:
    form = await _form(request)
    model = _form_model(form)
    audio = form.file("file")
    if audio is None:
        raise InvalidRequest("Missing required file: 'file'.", param="file")
    data, name = audio.data, audio.filename or ""
    return await _run(
        request,
        Call(
            endpoint,
            path,
            model,
            form=form,
            estimate=lambda prices: bills.transcription_estimate(prices, data, name),
            bill=lambda prices, raw, answer: bills.transcription_bill(prices, data, name, answer),
        ),
    )


async def audio_speech(request: web.Request) -> web.StreamResponse:
    body = parse_json_object(await request.read())
    model = _text(body, "model")
    text = _text(body, "input")
    _text(body, "voice")
    fmt = body.get("response_format") or "mp3"
    assert model is not None and text is not None
    return await _run(
        request,
        Call(
            "audio.speech",
            "/audio/speech",
            model,
            json=body,
            estimate=lambda prices: bills.speech_estimate(prices, text),
            bill=lambda prices, raw, answer: bills.speech_bill(prices, text, raw, str(fmt)),
            stream=True,
        ),
    )


# -- moderations and rerank -----------------------------------------------------------------------


async def moderations(request: web.Request) -> web.StreamResponse:
    body = parse_json_object(await request.read())
    inputs = body.get("input")
    if not isinstance(inputs, str | list) or not inputs:
        raise InvalidRequest(
            "'input' must be a string, or a non-empty array of strings or content parts.",
            param="input",
        )
    model = _text(body, "model", required=False) or DEFAULT_MODERATION_MODEL
    return await _run(
        request,
        Call(
            "moderations",
            "/moderations",
            model,
            json={**body, "model": model},
            bill=lambda prices, raw, answer: bills.moderation_bill(prices, inputs),
        ),
    )


async def rerank(request: web.Request) -> web.StreamResponse:
    body = parse_json_object(await request.read())
    model = _text(body, "model")
    _text(body, "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise InvalidRequest(
            "'documents' must be a non-empty array of strings (or of {\"text\": ...}).",
            param="documents",
        )
    for i, document in enumerate(documents):
        if not isinstance(document, str | dict):
            raise InvalidRequest(
                f"'documents[{i}]' must be a string or an object.", param=f"documents[{i}]"
            )
    _count(body.get("top_n"), "top_n", len(documents))
    count = len(documents)
    assert model is not None
    return await _run(
        request,
        Call(
            "rerank",
            "/rerank",
            model,
            json=body,
            estimate=lambda prices: bills.rerank_estimate(prices, count),
            bill=lambda prices, raw, answer: bills.rerank_bill(prices, count, answer),
        ),
    )
