"""The OpenAI Responses wire format (`POST {api_base}/responses`), the answer side.

Pure: SSE frames or a Response object in, the gateway's stream events out. A Response is a list
of output items (`message`, `reasoning`, `function_call`, ...), each with explicit added/done
events, so like the Anthropic parser this one never has to guess where a block ends. One item
can hold several blocks: a message has one text block per content part, a reasoning item one
reasoning block per summary part (and per `reasoning_text` content part). Blocks are keyed by
the item's `output_index` plus the part's index and numbered 0, 1, 2, ... in first-seen order.
Items of other types (server-side tool calls and the like) become blocks of that kind carrying
the item itself.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import orjson

from gateway.errors import UpstreamProtocolError
from gateway.stream.events import (
    REASONING,
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    FrameKind,
    StreamEvent,
    StreamFailure,
    Usage,
)
from gateway.stream.sse import SSEFrame

# `incomplete_details.reason` -> the OpenAI chat finish_reason.
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}

# A block key: (channel, output_index, part index). Channels: "content" (message content parts),
# "summary" (reasoning summary parts), "reasoning" (reasoning_text content parts), "item" (the
# whole item: function calls and unknown item types, part index 0).
_Key = tuple[str, int, int]

_TEXT_PARTS = ("output_text", "refusal")
_KNOWN_ITEMS = ("message", "reasoning", "function_call")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Responses usage in OpenAI chat names; the original stays under `provider_usage`."""
    prompt = _int(usage.get("input_tokens"))
    completion = _int(usage.get("output_tokens"))
    total = usage.get("total_tokens")
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total if _is_int(total) else prompt + completion,
    }
    input_details = usage.get("input_tokens_details")
    cached = input_details.get("cached_tokens") if isinstance(input_details, dict) else None
    if _is_int(cached):
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    output_details = usage.get("output_tokens_details")
    reasoning = output_details.get("reasoning_tokens") if isinstance(output_details, dict) else None
    if _is_int(reasoning):
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    out["provider_usage"] = usage
    return out


def _failure(
    error: Any, fallback: str = "the provider reported an error in the stream"
) -> StreamFailure:
    error = error if isinstance(error, dict) else {}
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = fallback
    code = error.get("code")
    if code is None:
        code = error.get("type")
    code = str(code) if code is not None else "upstream_error"
    status = 429 if "rate_limit" in code or code == "too_many_requests" else 500
    return StreamFailure(message, {"code": code, "message": message, "status_code": status})


def _finish(response: dict[str, Any], saw_tool_call: bool = False) -> Finish:
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(reason, str) and reason:
            return Finish(INCOMPLETE_REASONS.get(reason, reason))
        return Finish("length")
    output = response.get("output")
    has_call = saw_tool_call or any(
        isinstance(item, dict) and item.get("type") == "function_call"
        for item in (output if isinstance(output, list) else ())
    )
    return Finish("tool_calls" if has_call else "stop")


class ResponsesStreamParser:
    def __init__(self) -> None:
        self._next_index = 0
        self._blocks: dict[_Key, int] = {}  # every block seen -> gateway block index
        self._closed: set[_Key] = set()
        self._saw_tool_call = False
        self.done = False  # saw the terminal event (completed / incomplete)
        self.finished = False  # saw a finish (same events: Responses has no [DONE])
        self.response_id: str | None = None  # the `response.created`'s response id

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        data = frame.data
        if data is None:
            return [], "comment"
        if data.strip() == "[DONE]":  # not sent by OpenAI, but some proxies add it
            self.done = True
            return [], "done"
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"invalid JSON in a stream event: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError(f"a stream event is not a JSON object: {data[:200]!r}")
        kind = obj.get("type")
        if frame.event == "error" or kind == "error":
            error = obj.get("error")
            return [_failure(error if isinstance(error, dict) else obj)], "error"
        if kind == "response.failed":
            response = obj.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            return [_failure(error, "the response failed")], "error"
        if kind in ("response.completed", "response.incomplete"):
            response = obj.get("response")
            events = self.finish(response if isinstance(response, dict) else {})
            return events, "done"
        return self.event(obj), "data"

    # -- events ----------------------------------------------------------------------------------

    def event(self, obj: dict[str, Any]) -> list[StreamEvent]:
        """One event other than the terminal ones and errors (those are handled by `feed`)."""
        kind = obj.get("type")
        if not isinstance(kind, str):
            return []
        position = obj.get("output_index")
        if not _is_int(position):
            if kind == "response.created" and isinstance(response := obj.get("response"), dict):
                answer_id = response.get("id")
                self.response_id = answer_id if isinstance(answer_id, str) else None
            return []  # response.created / in_progress / queued and anything item-less
        out: list[StreamEvent] = []
        if kind == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict):
                self._item_added(out, position, item)
        elif kind == "response.output_item.done":
            item = obj.get("item")
            if isinstance(item, dict):
                self._item_events(out, position, item)  # whatever the deltas did not show
            final = item if isinstance(item, dict) and _kind(item) not in _KNOWN_ITEMS else None
            self._end_item(out, position, final)
        elif kind == "response.content_part.added":
            part = obj.get("part")
            self._part(out, position, _int(obj.get("content_index")), part)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            self._delta(out, ("content", position, _int(obj.get("content_index"))), obj)
        elif kind == "response.reasoning_summary_part.added":
            key: _Key = ("summary", position, _int(obj.get("summary_index")))
            part = obj.get("part")
            self._open(out, key, REASONING)
            text = part.get("text") if isinstance(part, dict) else None
            self._text(out, key, text)
        elif kind == "response.reasoning_summary_text.delta":
            self._delta(out, ("summary", position, _int(obj.get("summary_index"))), obj)
        elif kind == "response.reasoning_text.delta":
            self._delta(out, ("reasoning", position, _int(obj.get("content_index"))), obj)
        elif kind == "response.function_call_arguments.delta":
            self._saw_tool_call = True
            self._delta(out, ("item", position, 0), obj, TOOL_CALL)
        elif kind in ("response.output_text.done", "response.refusal.done"):
            field = "text" if kind == "response.output_text.done" else "refusal"
            self._done(out, ("content", position, _int(obj.get("content_index"))), obj, field)
        elif kind == "response.content_part.done":
            key = ("content", position, _int(obj.get("content_index")))
            self._part(out, position, key[2], obj.get("part"))
            self._end(out, key)
        elif kind in (
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
        ):
            key = ("summary", position, _int(obj.get("summary_index")))
            part = obj.get("part")
            text = part.get("text") if isinstance(part, dict) else obj.get("text")
            self._done_text(out, key, REASONING, text)
        elif kind == "response.reasoning_text.done":
            key = ("reasoning", position, _int(obj.get("content_index")))
            self._done_text(out, key, REASONING, obj.get("text"))
        elif kind == "response.function_call_arguments.done":
            self._saw_tool_call = True
            self._done(out, ("item", position, 0), obj, "arguments", TOOL_CALL)
        return out

    def finish(self, response: dict[str, Any]) -> list[StreamEvent]:
        """The terminal `response.completed` / `response.incomplete`: close, finish, usage."""
        out: list[StreamEvent] = []
        for key, index in self._blocks.items():
            if key not in self._closed:
                out.append(BlockEnd(index))
        self._closed.update(self._blocks)
        out.append(_finish(response, self._saw_tool_call))
        usage = response.get("usage")
        if isinstance(usage, dict):
            out.append(Usage(openai_usage(usage)))
        self.finished = self.done = True
        return out

    # -- items -----------------------------------------------------------------------------------

    def _item_added(self, out: list[StreamEvent], position: int, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "function_call":
            self._saw_tool_call = True
            self._open(out, ("item", position, 0), TOOL_CALL, item)
            self._text(out, ("item", position, 0), item.get("arguments"))
        elif kind in ("message", "reasoning"):
            self._item_events(out, position, item)  # normally empty at this point
        else:
            self._open(out, ("item", position, 0), _kind(item), item)

    def _item_events(self, out: list[StreamEvent], position: int, item: dict[str, Any]) -> None:
        """Blocks of an item that the stream has not shown yet (all of them for a whole item)."""
        kind = item.get("type")
        if kind == "message":
            for content_index, part in enumerate(_list(item.get("content"))):
                self._part(out, position, content_index, part)
        elif kind == "reasoning":
            for summary_index, part in enumerate(_list(item.get("summary"))):
                if isinstance(part, dict):
                    key: _Key = ("summary", position, summary_index)
                    self._done_text(out, key, REASONING, part.get("text"))
            for content_index, part in enumerate(_list(item.get("content"))):
                if isinstance(part, dict) and part.get("type") == "reasoning_text":
                    key = ("reasoning", position, content_index)
                    self._done_text(out, key, REASONING, part.get("text"))
        elif kind == "function_call":
            self._saw_tool_call = True
            key = ("item", position, 0)
            if key not in self._blocks:
                self._open(out, key, TOOL_CALL, item)
                self._text(out, key, item.get("arguments"))
        else:
            self._open(out, ("item", position, 0), _kind(item), item)

    def _part(self, out: list[StreamEvent], position: int, content_index: int, part: Any) -> None:
        """A message content part: a text block, filled from the part when it came whole."""
        if not isinstance(part, dict):
            return
        kind = part.get("type")
        key: _Key = ("content", position, content_index)
        if kind in _TEXT_PARTS:
            text = part.get("text") if kind == "output_text" else part.get("refusal")
            self._done_text(out, key, TEXT, text, close=False)
        elif key not in self._blocks:
            self._open(out, key, str(kind), part)

    def _end_item(
        self, out: list[StreamEvent], position: int, final: dict[str, Any] | None = None
    ) -> None:
        """Ends the item's open blocks; an unknown item's block gets the final item as data."""
        for key, index in self._blocks.items():
            if key[1] == position and key not in self._closed:
                data = final if key[0] == "item" else None
                out.append(BlockEnd(index, data))
                self._closed.add(key)

    # -- blocks ----------------------------------------------------------------------------------

    def _open(
        self, out: list[StreamEvent], key: _Key, kind: str, item: dict[str, Any] | None = None
    ) -> int:
        index = self._blocks.get(key)
        if index is not None:
            return index
        index = self._blocks[key] = self._next_index
        self._next_index += 1
        if kind == TOOL_CALL:
            item = item or {}
            out.append(
                BlockStart(index, TOOL_CALL, _str(item.get("call_id")), _str(item.get("name")))
            )
        elif kind in (TEXT, REASONING):
            out.append(BlockStart(index, kind))
        else:
            out.append(BlockStart(index, kind, data=item))
        return index

    def _text(self, out: list[StreamEvent], key: _Key, text: Any) -> None:
        index = self._blocks.get(key)
        if index is not None and key not in self._closed and isinstance(text, str) and text:
            out.append(BlockDelta(index, text))

    def _delta(
        self, out: list[StreamEvent], key: _Key, obj: dict[str, Any], kind: str | None = None
    ) -> None:
        if kind is None:
            kind = TEXT if key[0] == "content" else REASONING
        self._open(out, key, kind)
        delta = obj.get("delta")
        if isinstance(delta, str):
            self._text(out, key, delta)

    def _done(
        self,
        out: list[StreamEvent],
        key: _Key,
        obj: dict[str, Any],
        field: str,
        kind: str = TEXT,
    ) -> None:
        self._done_text(out, key, kind, obj.get(field))

    def _done_text(
        self, out: list[StreamEvent], key: _Key, kind: str, text: Any, *, close: bool = True
    ) -> None:
        """A part's final text: opens and fills the block when no delta did, then ends it."""
        if key not in self._blocks:
            self._open(out, key, kind)
            self._text(out, key, text)
        if close:
            self._end(out, key)

    def _end(self, out: list[StreamEvent], key: _Key) -> None:
        index = self._blocks.get(key)
        if index is not None and key not in self._closed:
            self._closed.add(key)
            out.append(BlockEnd(index))


def _kind(item: dict[str, Any]) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) and kind else "unknown"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def parse_response(obj: dict[str, Any]) -> list[StreamEvent]:
    """A non-streaming Response object as the same events a stream would give."""
    error = obj.get("error")
    if obj.get("status") == "failed" or error:
        return [_failure(error, "the response failed")]
    parser = ResponsesStreamParser()
    out: list[StreamEvent] = []
    for position, item in enumerate(_list(obj.get("output"))):
        if isinstance(item, dict):
            out += parser.event(
                {"type": "response.output_item.done", "output_index": position, "item": item}
            )
    return out + parser.finish(obj)
