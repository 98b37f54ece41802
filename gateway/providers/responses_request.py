"""An OpenAI chat body as a native Responses API request, for deployments that speak it.

The gateway keeps the conversation, so the upstream gets the whole history as input items and
`store: false`: no state lives upstream, and any provider can take the next turn.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.providers.params import RESPONSES_EXTRAS, responses_fields


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text", "")) for p in content or () if isinstance(p, dict) and "text" in p
    )


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            parts.append(
                {
                    "type": "input_image",
                    "image_url": url.get("url") if isinstance(url, dict) else url,
                }
            )
    return parts


def to_responses_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in body.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            instructions.append(_text(message.get("content")))
        elif role == "user":
            items.append({"role": "user", "content": _user_content(message.get("content"))})
        elif role == "assistant":
            text = _text(message.get("content"))
            if text:
                items.append({"role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments", ""),
                    }
                )
        elif role == "tool":
            content = message.get("content")
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": content
                    if isinstance(content, str)
                    else orjson.dumps(content).decode(),
                }
            )
    request: dict[str, Any] = {"model": model, "input": items, "stream": stream, "store": False}
    if instructions:
        request["instructions"] = "\n\n".join(instructions)
    tools = [
        {
            "type": "function",
            "name": (tool.get("function") or {}).get("name"),
            "description": (tool.get("function") or {}).get("description"),
            "parameters": (tool.get("function") or {}).get("parameters", {}),
            # The Responses API takes a tool without `strict` as strict; a chat tool without
            # it is not, so the client's choice is said either way.
            "strict": (tool.get("function") or {}).get("strict") is True,
        }
        for tool in body.get("tools") or ()
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    # A Responses client's hosted tools, as it sent them (gateway.providers.params).
    hosted = body.get(RESPONSES_EXTRAS)
    if isinstance(hosted, dict):
        tools += list(hosted.values())
    if tools:
        request["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        request["tool_choice"] = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        request["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int):
        request["max_output_tokens"] = limit
    for key in ("temperature", "top_p", "user", "parallel_tool_calls", "metadata"):
        if body.get(key) is not None:
            request[key] = body[key]
    if body.get("reasoning_effort"):
        request["reasoning"] = {"effort": body["reasoning_effort"], "summary": "auto"}
    # response_format, verbosity, service tier, prompt cache, safety identifier; what cannot be
    # carried was refused before (gateway.providers.params).
    request.update(responses_fields(body))
    return request
