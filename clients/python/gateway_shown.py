"""Tell the gateway how much of a streamed answer your app showed, so the model remembers that.

The gateway records what reached the client's socket. An app that renders slowly (Markdown,
speech) has often received more than it showed when the user pressed Stop. Wrap the SDK's
stream; when it is closed before the app showed everything, the wrapper reports the count to
`POST /v1/conversations/{id}/turns/{turn_id}/truncate` (docs/clients.md):

    stream = client.chat.completions.create(model="demo", messages=messages, stream=True)
    with ShownStream(stream) as shown:
        for chunk in shown:
            render(chunk)
            if stop_pressed():
                break

Every piece of text the loop took counts as shown. An app that can stop between taking a piece
and showing it passes `manual=True` and calls `shown.shown(text)` for what it rendered.

For `openai` (chat completions and Responses streams, plain or `with_raw_response`) and
`anthropic` (`messages.create(stream=True)` and `messages.stream()`), sync and async, with
nothing beyond them and the standard library. Against a server that is not the gateway (no
`X-Gateway-Turn-Id`), nothing is reported.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

__all__ = ["AsyncShownStream", "ShownReportError", "ShownStream", "text_of"]

# A turn is recorded as ended a moment after its stream closes (the gateway first learns what
# the client's socket acknowledged); until then the truncate answers `409 turn_in_progress`.
END_WAIT_S = 15.0
_AUTH_HEADERS = ("authorization", "x-api-key", "api-key")


class ShownReportError(Exception):
    """The gateway refused the report; `status` and `body` are its answer."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else body
        super().__init__(f"truncate answered {status}: {message}")
        self.status = status
        self.body = body


def text_of(item: Any) -> str:
    """The answer text a stream item carries, as the gateway counts it: a chat chunk's first
    choice, an Anthropic text delta, a Responses output text delta. Reasoning does not count."""
    kind = getattr(item, "type", None)
    if kind == "content_block_delta":
        delta = item.delta
        return str(delta.text) if getattr(delta, "type", None) == "text_delta" else ""
    if kind == "response.output_text.delta":
        return str(item.delta)
    # Chat chunks: the gateway records the first choice only.
    for choice in getattr(item, "choices", None) or ():
        if choice.index == 0 and choice.delta is not None:
            return str(choice.delta.content or "")
    return ""


class _Tracker:
    """What both wrappers share: the counts, and the request that reports them."""

    def __init__(self, stream: Any, manual: bool) -> None:
        if hasattr(stream, "http_response") and hasattr(stream, "parse"):
            # `with_raw_response`: the headers are on the raw response, the stream is parsed.
            self.response: Any = stream.http_response
            stream = stream.parse()
        else:
            self.response = stream.response
        self._stream = stream
        self._manual = manual
        self.received_chars = 0  # code points of answer text the SDK handed to the app
        self.shown_chars = 0
        self.finished = False  # the app read the stream to its end
        self.closed = False
        self.truncation: dict[str, Any] | None = None  # the gateway's answer to the report

    def shown(self, text: str) -> None:
        """Count `text` as shown (with `manual=True`; otherwise every piece taken counts)."""
        self.shown_chars += len(text)

    def _took(self, item: Any) -> None:
        chars = len(text_of(item))
        self.received_chars += chars
        if not self._manual:
            self.shown_chars += chars

    def _report_call(self) -> tuple[str, dict[str, str], bytes] | None:
        """The truncate request (URL, headers, body), or None when there is nothing to say."""
        if self.finished and self.shown_chars >= self.received_chars:
            return None
        conversation_id = self.response.headers.get("x-conversation-id")
        turn_id = self.response.headers.get("x-gateway-turn-id")
        if not conversation_id or not turn_id:
            return None
        # The gateway's API root is where the SDK's own request went: .../v1/chat/completions,
        # .../v1/responses, .../v1/messages. Its key goes with the report.
        request = self.response.request
        url = urllib.parse.urlsplit(str(request.url))
        if "/v1/" not in url.path:
            return None
        root = url.path[: url.path.rfind("/v1/") + len("/v1")]
        path = "{}/conversations/{}/turns/{}/truncate".format(
            root, urllib.parse.quote(conversation_id, safe=":"), urllib.parse.quote(turn_id)
        )
        headers = {"Content-Type": "application/json"}
        for name in _AUTH_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        body = json.dumps({"content_chars": self.shown_chars}).encode()
        return urllib.parse.urlunsplit((url.scheme, url.netloc, path, "", "")), headers, body


def _post(url: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, _json(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, _json(error.read())


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _in_progress(status: int, body: Any) -> bool:
    return (
        status == 409
        and isinstance(body, dict)
        and body.get("error", {}).get("code") == "turn_in_progress"
    )


def _result(status: int, body: Any) -> dict[str, Any]:
    if status != 200 or not isinstance(body, dict):
        raise ShownReportError(status, body)
    return body


class ShownStream(_Tracker):
    """A sync SDK stream that reports, when closed, how much of its answer the app showed."""

    def __init__(self, stream: Any, *, manual: bool = False) -> None:
        super().__init__(stream, manual)

    def __iter__(self) -> Iterator[Any]:
        for item in self._stream:
            self._took(item)
            yield item
        self.finished = True

    def close(self) -> dict[str, Any] | None:
        """Close the stream and report what was shown: the gateway's answer (the text it now
        records is its `content`), or None when nothing needed saying."""
        if self.closed:
            return self.truncation
        self.closed = True
        self._stream.close()
        call = self._report_call()
        if call is None:
            return None
        deadline = time.monotonic() + END_WAIT_S
        delay = 0.05
        status, body = _post(*call)
        while _in_progress(status, body) and time.monotonic() + delay < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            status, body = _post(*call)
        self.truncation = _result(status, body)
        return self.truncation

    def __enter__(self) -> ShownStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except ShownReportError:
            if exc is None:
                raise  # else the app's own error is the one to see


class AsyncShownStream(_Tracker):
    """An async SDK stream that reports, when closed, how much of its answer the app showed."""

    def __init__(self, stream: Any, *, manual: bool = False) -> None:
        super().__init__(stream, manual)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for item in self._stream:
            self._took(item)
            yield item
        self.finished = True

    async def close(self) -> dict[str, Any] | None:
        """Close the stream and report what was shown: the gateway's answer (the text it now
        records is its `content`), or None when nothing needed saying."""
        if self.closed:
            return self.truncation
        self.closed = True
        await self._stream.close()
        call = self._report_call()
        if call is None:
            return None
        deadline = time.monotonic() + END_WAIT_S
        delay = 0.05
        # urllib blocks: the request runs on a thread, the loop stays free.
        status, body = await asyncio.to_thread(_post, *call)
        while _in_progress(status, body) and time.monotonic() + delay < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            status, body = await asyncio.to_thread(_post, *call)
        self.truncation = _result(status, body)
        return self.truncation

    async def __aenter__(self) -> AsyncShownStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except ShownReportError:
            if exc is None:
                raise
