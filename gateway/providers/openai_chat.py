"""The OpenAI Chat Completions wire format (OpenAI, DeepSeek, OpenRouter, Groq, vLLM, ...).

Pure: SSE frames or a completion object in, the gateway's stream events out. Chat chunks carry no
block boundaries, so this parser draws them: a block closes when a block of another channel
starts (text, reasoning, or tool calls) or at `finish_reason`. Parallel tool calls stay open
side by side until text, reasoning or the finish arrives.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec
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


class ChoiceSink(Protocol):
    """Where an n > 1 stream's choices after the first go (gateway.metering.choices)."""

    def add(self, choice: dict[str, Any]) -> None: ...


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(error, str) and error:
        return error
    return "the provider reported an error in the stream"


# One more piece of open text, and nothing else, as a type: a chunk decodes into these only if
# it has exactly one choice, of index 0, whose delta has string content and no reasoning or tool
# calls, with no finish, usage or error (each absent or null); every other field (the id,
# model, created, fingerprint, logprobs of every chunk) is skipped unbuilt. A chunk of any other
# shape fails the decode and takes the general way (`feed`). Never part of a reference cycle,
# so never tracked by the garbage collector.
class _Delta(msgspec.Struct, gc=False):
    content: str
    reasoning_content: None = None
    reasoning: None = None
    tool_calls: None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta
    index: Literal[0] = 0
    finish_reason: None = None


class _TextChunk(msgspec.Struct, gc=False):
    choices: tuple[_Choice]
    usage: None = None
    error: None = None


_read_text_chunk = msgspec.json.Decoder(_TextChunk).decode


class ChatStreamParser:
    def __init__(self) -> None:
        self._next_index = 0
        self._open: dict[str | int, int] = {}  # channel key -> block index; int keys = tool index
        self.done = False  # saw `data: [DONE]`
        self.finished = False  # saw a finish_reason
        self.response_id: str | None = None  # the first chunk's `id`
        # n > 1: where the other choices go, for metering (set by the relay only then).
        self.others: ChoiceSink | None = None

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        data = frame.data
        if data is None:
            return [], "comment"
        if data == "[DONE]":  # the usual spelling, without an exception from the JSON parser
            self.done = True
            return [], "done"
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            # Once a stream: no strip() and compare on every chunk to find the end.
            if data.strip() == "[DONE]":
                self.done = True
                return [], "done"
            raise UpstreamProtocolError(f"invalid JSON in a stream chunk: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError(f"a stream chunk is not a JSON object: {data[:200]!r}")
        # (Azure's first chunk, of prompt filter results, has an empty id.)
        if not self.response_id and type(answer_id := obj.get("id")) is str:
            self.response_id = answer_id
        if frame.event == "error" or obj.get("error"):
            error = obj.get("error", obj)
            upstream = error if isinstance(error, dict) else {"message": str(error)}
            return [StreamFailure(_error_message(error), upstream)], "error"
        choices = obj.get("choices")
        if (text := self._more_text(obj, choices)) is not None:
            return [BlockDelta(self._open[TEXT], text)], "data"
        events = self.chunk(obj)
        if not choices and obj.get("usage"):
            return events, "usage_only"
        return events, "data"

    def text_run(self, pieces: list[bytes], start: int) -> tuple[int, list[str], int]:
        """Frames in a row (`SSEDecoder.split`'s pieces, from `start`) that are each one more
        piece of the text block already open (most frames of an answer): that block's index,
        the pieces, exactly the BlockDeltas `feed` would give, without building any event,
        and where the run stopped (at the first frame that is not one: `feed` takes it)."""
        texts: list[str] = []
        if len(self._open) != 1 or (index := self._open.get(TEXT)) is None:
            return 0, texts, start
        read, append = _read_text_chunk, texts.append
        i, n = start, len(pieces)
        while i < n:
            piece = pieces[i]
            if not piece.startswith(b"data: {"):
                break  # `[DONE]`, another field, or an object after whitespace: `feed`'s
            try:
                append(read(piece[6:]).choices[0].delta.content)
            except msgspec.DecodeError:  # not JSON, or not that shape (ValidationError)
                break
            i += 1
        return index, texts, i

    def _more_text(self, obj: dict[str, Any], choices: object) -> str | None:
        """Most chunks of an answer are one more piece of the text block already open: read
        that without the general walk (it runs once per frame). None: take the general way.
        Exactly what `chunk` would give for such a chunk, as the piece's text."""
        if len(self._open) != 1 or type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if TEXT not in self._open or type(choice) is not dict or obj.get("usage") is not None:
            return None
        delta = choice.get("delta")
        if (
            type(delta) is not dict
            or choice.get("finish_reason")
            or choice.get("index", 0) != 0
            or delta.get("reasoning_content") is not None
            or delta.get("reasoning") is not None
            or delta.get("tool_calls")
        ):
            return None
        content = delta.get("content")
        return content if type(content) is str else None

    def chunk(self, obj: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():  # else malformed: no choice
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                # n > 1: only the first choice is assembled; the others are only metered.
                if self.others is not None and isinstance(choice, dict):
                    self.others.add(choice)
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                reasoning = delta.get("reasoning_content")
                if reasoning is None:
                    reasoning = delta.get("reasoning")
                if isinstance(reasoning, str):
                    self._delta(out, REASONING, REASONING, reasoning)
                content = delta.get("content")
                if isinstance(content, str):
                    self._delta(out, TEXT, TEXT, content)
                calls = delta.get("tool_calls")
                for call in calls if isinstance(calls, list) else ():
                    self._tool(out, call)
            reason = choice.get("finish_reason")
            if reason:
                for index in self._open.values():
                    out.append(BlockEnd(index))
                self._open.clear()
                self.finished = True
                out.append(Finish(str(reason)))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            out.append(Usage(_with_tier(usage, obj)))
        return out

    def _delta(
        self,
        out: list[StreamEvent],
        key: str | int,
        kind: str,
        text: str | None,
        id: str | None = None,
        name: str | None = None,
    ) -> None:
        index = self._open.get(key)
        if index is None:
            is_tool = isinstance(key, int)
            for other, other_index in list(self._open.items()):
                if not (is_tool and isinstance(other, int)):
                    out.append(BlockEnd(other_index))
                    del self._open[other]
            index = self._open[key] = self._next_index
            self._next_index += 1
            out.append(BlockStart(index, kind, id, name))
        if text is not None:
            out.append(BlockDelta(index, text))

    def _tool(self, out: list[StreamEvent], call: object) -> None:
        if not isinstance(call, dict):
            return
        position = call.get("index", 0)
        if not isinstance(position, int):
            position = 0
        function = call.get("function") or {}
        arguments = function.get("arguments") if isinstance(function, dict) else None
        self._delta(
            out,
            position,
            TOOL_CALL,
            arguments if isinstance(arguments, str) else None,
            id=call.get("id"),
            name=function.get("name") if isinstance(function, dict) else None,
        )


def parse_completion(obj: dict[str, Any]) -> list[StreamEvent]:
    """A non-streaming chat completion as the same events a stream would give."""
    if obj.get("error"):
        error = obj["error"]
        upstream = error if isinstance(error, dict) else {"message": str(error)}
        return [StreamFailure(_error_message(error), upstream)]
    choices = obj.get("choices")
    if type(choices) is list and len(choices) == 1 and (plain := _plain_text(choices[0])):
        # The usual answer, text alone: the events the general way gives, made directly.
        text, reason = plain
        out: list[StreamEvent] = [BlockStart(0, TEXT), BlockDelta(0, text)]
        if reason:
            out += (BlockEnd(0), Finish(str(reason)))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            out.append(Usage(_with_tier(usage, obj)))
        return out
    parser = ChatStreamParser()
    out = []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        message = choice.get("message") or {}
        delta = {
            "reasoning_content": message.get("reasoning_content"),
            "reasoning": message.get("reasoning"),
            "content": message.get("content"),
            "tool_calls": [
                {**call, "index": i} for i, call in enumerate(message.get("tool_calls") or ())
            ],
        }
        out += parser.chunk({"choices": [{"index": 0, "delta": delta}]})
        out += parser.chunk(
            {"choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]}
        )
    if isinstance(obj.get("usage"), dict):
        out.append(Usage(_with_tier(obj["usage"], obj)))
    return out


def _with_tier(usage: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The usage, with the service tier other than the default the answer says it was served
    at (OpenAI's `service_tier`, beside the usage in the same object): it is priced at it."""
    tier = obj.get("service_tier")
    if not isinstance(tier, str) or tier in ("default", "auto", "standard"):
        return usage
    return {**usage, "service_tier": tier}


def _plain_text(choice: object) -> tuple[str, object] | None:
    """A first choice whose message is text alone (no reasoning, no tool calls): its text and
    finish reason. None: the general way."""
    if type(choice) is not dict or choice.get("index", 0) != 0:
        return None
    message = choice.get("message")
    if type(message) is not dict:
        return None
    content = message.get("content")
    if (
        type(content) is not str
        or message.get("reasoning_content") is not None
        or message.get("reasoning") is not None
        or message.get("tool_calls")
    ):
        return None
    return content, choice.get("finish_reason")
