"""Multipart forms in and out: the API calls whose requests carry files (audio transcriptions and
translations, image edits and variations, file uploads).

A form is read whole, within `server.max_upload_mb`, into its parts in order (each field or file
with its name, bytes, file name and content type), so that the gateway can read the fields it
routes and meters by (`model`, `purpose`, the audio's length) and then send the same form to a
deployment with its model replaced, under a boundary of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.ids import random_hex

_CHUNK = 1 << 16


@dataclass
class Part:
    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass
class Form:
    parts: list[Part] = field(default_factory=list)

    def value(self, name: str) -> str | None:
        """A field's text (the first of that name); None when absent or a file."""
        for part in self.parts:
            if part.name == name and part.filename is None:
                return part.text
        return None

    def file(self, name: str) -> Part | None:
        for part in self.parts:
            if part.name == name and part.filename is not None:
                return part
        return None

    def fields(self) -> dict[str, str | list[str]]:
        """Its text fields by name; a repeated one (`timestamp_granularities[]`) as a list."""
        out: dict[str, str | list[str]] = {}
        for part in self.parts:
            if part.filename is not None:
                continue
            if part.name in out:
                earlier = out[part.name]
                out[part.name] = [*(earlier if isinstance(earlier, list) else [earlier]), part.text]
            else:
                out[part.name] = part.text
        return out

    def encode(self, values: dict[str, str]) -> tuple[bytes, str]:
        """The form as a multipart body, each field named in `values` given that value (added
        when absent); and its `Content-Type`."""
        boundary = f"gateway-{random_hex(16)}"
        out: list[bytes] = []
        seen: set[str] = set()
        parts = list(self.parts)
        parts += [Part(name, b"") for name in values if all(p.name != name for p in parts)]
        for part in parts:
            data = part.data
            if part.name in values and part.filename is None:
                if part.name in seen:
                    continue  # the replaced field once, not each of its copies
                seen.add(part.name)
                data = values[part.name].encode()
            disposition = f'form-data; name="{_quoted(part.name)}"'
            if part.filename is not None:
                disposition += f'; filename="{_quoted(part.filename)}"'
            head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
            if part.content_type:
                head += f"Content-Type: {part.content_type}\r\n"
            out += (head.encode(), b"\r\n", data, b"\r\n")
        out.append(f"--{boundary}--\r\n".encode())
        return b"".join(out), f"multipart/form-data; boundary={boundary}"


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "").replace("\n", "")


async def read_form(request: web.Request, limit: int) -> Form:
    """The request's multipart form, at most `limit` bytes of parts; a 400 for anything but
    a well-formed `multipart/form-data`, a 413 past the limit."""
    if request.content_type != "multipart/form-data":
        raise InvalidRequest(
            f"This endpoint takes multipart/form-data, not {request.content_type or 'no body'}."
        )
    try:
        return await _read(await request.multipart(), limit)
    except (ValueError, AssertionError, HttpProcessingError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        raise InvalidRequest(f"The multipart form cannot be read: {message}"[:300]) from None


async def _read(reader: MultipartReader, limit: int) -> Form:
    form = Form()
    size = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise InvalidRequest("Nested multipart forms are not accepted.")
        chunks: list[bytes] = []
        while chunk := await part.read_chunk(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"The form is larger than the upload limit of {limit} bytes"
                    " (server.max_upload_mb)."
                )
            chunks.append(chunk)
        form.parts.append(
            Part(
                part.name or "",
                b"".join(chunks),
                part.filename,
                part.headers.get("Content-Type"),
            )
        )
    return form
