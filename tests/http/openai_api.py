"""A fake of OpenAI's other endpoints (images, audio, moderations, files, batches) and of a
Cohere/Jina-shaped `/rerank`, in their exact request and answer formats: JSON or multipart in,
JSON, text or audio bytes out. Every request is kept, with its multipart parts decoded, so a
test can assert what the upstream received; `fail` queues error statuses."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.test_utils import TestServer

API_KEY = "sk-openai-api-fake-0123456789"
SPEECH = b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 64  # 16 KiB of "audio"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image").decode()


def wav(seconds: float, rate: int = 16_000) -> bytes:
    """A silent mono 16-bit PCM WAV file of this length."""
    data = b"\x00\x00" * int(seconds * rate)
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    json: Any = None
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)  # name, data, type


class OpenAIAPI:
    def __init__(self) -> None:
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.seen: list[Seen] = []
        self.failures: list[int] = []  # statuses to answer next, one request each
        self.usage: dict[str, Any] | None = None  # an images or transcription answer's
        self.url = ""
        router = self.app.router
        for path in (
            "/v1/images/generations",
            "/v1/images/edits",
            "/v1/images/variations",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/audio/speech",
            "/v1/moderations",
            "/v1/rerank",
            "/v2/rerank",  # Cohere's, as litellm calls it
        ):
            router.add_post(path, self.handle)
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}  # id -> object, content
        self.batches: dict[str, dict[str, Any]] = {}
        router.add_post("/v1/files", self.upload)
        router.add_get("/v1/files/{id}", self.file)
        router.add_get("/v1/files/{id}/content", self.content)
        router.add_delete("/v1/files/{id}", self.delete)
        router.add_post("/v1/batches", self.batch)
        router.add_get("/v1/batches/{id}", self.batch_status)
        router.add_post("/v1/batches/{id}/cancel", self.batch_cancel)

    async def start(self, make: Callable[..., Awaitable[TestServer]]) -> OpenAIAPI:
        server = await make(self.app)
        self.url = str(server.make_url("/v1")).rstrip("/")
        return self

    def deployment(self, model: str, **extra: Any) -> dict[str, Any]:
        return {
            "provider": "openai",
            "api_base": self.url,
            "api_key": API_KEY,
            "model": model,
            **extra,
        }

    async def _read(self, request: web.Request) -> Seen:
        seen = Seen(request.method, request.path, dict(request.headers))
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                assert isinstance(part, BodyPartReader)
                data, name = bytes(await part.read()), part.name or ""
                if part.filename:
                    ctype = part.headers.get("Content-Type", "")
                    seen.files[name] = (part.filename, data, ctype)
                else:
                    seen.fields[name] = data.decode()
        elif request.can_read_body:
            seen.json = await request.json()
        return seen

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.headers["Authorization"] in (f"Bearer {API_KEY}", f"bearer {API_KEY}")
        seen = await self._read(request)
        self.seen.append(seen)
        if self.failures:
            status = self.failures.pop(0)
            error = {"message": f"fake failure {status}", "type": "server_error", "code": None}
            return web.json_response({"error": error}, status=status)
        path = request.path
        if path.startswith("/v1/images/"):
            n = int((seen.json or {}).get("n") or seen.fields.get("n") or 1)
            body: dict[str, Any] = {"created": int(time.time()), "data": [{"b64_json": PNG}] * n}
            if self.usage is not None:
                body["usage"] = self.usage
            return web.json_response(body)
        if path.startswith("/v1/audio/speech"):
            response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
            await response.prepare(request)
            for i in range(0, len(SPEECH), 4096):
                await response.write(SPEECH[i : i + 4096])
            await response.write_eof()
            return response
        if path.startswith("/v1/audio/"):
            if seen.fields.get("response_format") == "text":
                return web.Response(text="hello there\n", content_type="text/plain")
            body = {"text": "hello there"}
            if self.usage is not None:
                body["usage"] = self.usage
            return web.json_response(body)
        if path == "/v1/moderations":
            result = {"flagged": False, "categories": {}, "category_scores": {}}
            return web.json_response(
                {"id": "modr-1", "model": seen.json["model"], "results": [result]}
            )
        documents = seen.json["documents"]
        results = [
            {"index": i, "relevance_score": round(1 - i / len(documents), 3)}
            for i in range(len(documents))
        ][: seen.json.get("top_n") or len(documents)]
        return web.json_response(
            {"id": "rerank-1", "results": results, "meta": {"billed_units": {"search_units": 1}}}
        )

    # -- files and batches ------------------------------------------------------------------------

    def _new_file(self, name: str, purpose: str, data: bytes) -> dict[str, Any]:
        file_id = f"file-{len(self.files) + 1:04d}"
        obj = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": name,
            "purpose": purpose,
        }
        self.files[file_id] = (obj, data)
        return obj

    async def upload(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"
        seen = await self._read(request)
        self.seen.append(seen)
        name, data, _ = seen.files["file"]
        return web.json_response(self._new_file(name, seen.fields["purpose"], data))

    async def file(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, dict(request.headers)))
        found = self.files.get(request.match_info["id"])
        if found is None:
            return web.json_response({"error": {"message": "No such file"}}, status=404)
        return web.json_response(found[0])

    async def content(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, dict(request.headers)))
        found = self.files.get(request.match_info["id"])
        if found is None:
            return web.json_response({"error": {"message": "No such file"}}, status=404)
        return web.Response(body=found[1], content_type="application/octet-stream")

    async def delete(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, dict(request.headers)))
        file_id = request.match_info["id"]
        self.files.pop(file_id, None)
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    async def batch(self, request: web.Request) -> web.Response:
        seen = await self._read(request)
        self.seen.append(seen)
        batch_id = f"batch_{len(self.batches) + 1:04d}"
        self.batches[batch_id] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": seen.json["endpoint"],
            "input_file_id": seen.json["input_file_id"],
            "completion_window": seen.json["completion_window"],
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
        }
        return web.json_response(self.batches[batch_id])

    async def batch_status(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, dict(request.headers)))
        return web.json_response(self.batches[request.match_info["id"]])

    async def batch_cancel(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, dict(request.headers)))
        batch = self.batches[request.match_info["id"]]
        batch["status"] = "cancelling"
        return web.json_response(batch)

    def complete(self, batch_id: str, prompt: int = 100, completion: int = 20) -> None:
        """Run a batch: each request of its input answered, with this usage each."""
        batch = self.batches[batch_id]
        _, data = self.files[batch["input_file_id"]]
        lines = []
        for line in data.splitlines():
            request = json.loads(line)
            usage = {"prompt_tokens": prompt, "completion_tokens": completion}
            body = {
                "id": "chatcmpl-b",
                "object": "chat.completion",
                "model": request["body"]["model"],
                "choices": [],
                "usage": usage,
            }
            lines.append(
                json.dumps(
                    {
                        "id": "r",
                        "custom_id": request["custom_id"],
                        "response": {"status_code": 200, "body": body},
                        "error": None,
                    }
                )
            )
        output = self._new_file("output.jsonl", "batch_output", "\n".join(lines).encode())
        batch.update(status="completed", output_file_id=output["id"])
