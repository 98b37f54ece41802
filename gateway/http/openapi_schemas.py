"""JSON Schemas (OpenAPI 3.1 dialect) of the gateway's request and response bodies.

The admin bodies come from their pydantic models; the client dialects' bodies are written by
hand, covering the fields the parsers in `gateway.dialects` read and check. Those parsers
forward fields they do not know, so the dialect schemas leave `additionalProperties` open.
`tests/security/test_openapi.py` checks the examples here against these schemas and against a
live gateway, and schemathesis fuzzes the gateway with them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.metering.admin import KeyChanges, KeyRotation, NewKey, NewTeam, TeamChanges
from gateway.metering.limits import Limits

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
NULLABLE_STRING: Schema = {"type": ["string", "null"]}
OBJECT: Schema = {"type": "object"}
TEXT_PART: Schema = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": STRING, "text": STRING},
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _pydantic(*models: type[BaseModel]) -> dict[str, Schema]:
    """The models' JSON Schemas, their `$defs` hoisted into components."""
    out: dict[str, Schema] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


# -- who a key is -------------------------------------------------------------------------------


def _own_limits() -> Schema:
    """A key's or team's limits (Limits, as set), with what its budget has spent."""
    limits = Limits.model_json_schema(ref_template="#/components/schemas/{model}")
    return {
        "type": "object",
        "description": "A key's or team's limits (as set, `null` where none is), with what its"
        " budget has spent this period (`null` without a budget, or while the store is away).",
        "required": [*limits["properties"], "spent_usd", "period_start"],
        "properties": {
            **limits["properties"],
            "spent_usd": {"type": ["number", "null"]},
            "period_start": {"type": ["number", "null"], "description": "Unix seconds."},
        },
    }


OWN_LIMITS = _own_limits()

PRINCIPAL: Schema = {
    "type": "object",
    "required": ["object", "kind", "is_admin", "team_id", "key_id", "open", "budget"],
    "properties": {
        "object": {"const": "principal"},
        "kind": {"enum": ["admin", "key", "open"]},
        "is_admin": {"type": "boolean"},
        "team_id": NULLABLE_STRING,
        "key_id": NULLABLE_STRING,
        "team_name": {
            "type": ["string", "null"],
            "description": "A virtual key's team's name; `null` for the master key.",
        },
        "key_name": {
            "type": ["string", "null"],
            "description": "A virtual key's name, when it was given one.",
        },
        "user": NULLABLE_STRING,
        "models": {"type": ["array", "null"], "items": STRING},
        "open": {"type": "boolean", "description": "No master key is configured."},
        "budget": {
            "description": "A virtual key's own limits and its team's; `null` for the master"
            " key and an open gateway.",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["key", "team"],
                    "properties": {"key": ref("OwnLimits"), "team": ref("OwnLimits")},
                },
            ],
        },
    },
}


# -- errors --------------------------------------------------------------------------------------

ERROR: Schema = {
    "type": "object",
    "description": "The OpenAI error shape. Upstream errors passed through keep their own"
    " `error` object, which always has a `message`.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message"],
            "properties": {
                "message": STRING,
                "type": NULLABLE_STRING,
                "code": {"type": ["string", "integer", "null"]},
                "param": NULLABLE_STRING,
            },
        }
    },
}

ANTHROPIC_ERROR: Schema = {
    "type": "object",
    "description": "Anthropic's error shape, on /v1/messages.",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": STRING, "message": STRING},
        },
    },
}

# -- OpenAI Chat Completions ---------------------------------------------------------------------

CHAT_MESSAGE: Schema = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {
            "anyOf": [STRING, {"type": "array", "items": TEXT_PART}, {"type": "null"}],
        },
        "name": NULLABLE_STRING,
        "tool_call_id": NULLABLE_STRING,
        "reasoning_content": NULLABLE_STRING,
        "tool_calls": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {
                    "id": NULLABLE_STRING,
                    "type": NULLABLE_STRING,
                    "function": {
                        "type": ["object", "null"],
                        "properties": {"name": NULLABLE_STRING, "arguments": NULLABLE_STRING},
                    },
                },
            },
        },
    },
}

CHAT_REQUEST: Schema = {
    "type": "object",
    "description": "Fields not listed are forwarded to the upstream unchanged.",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "description": "A model alias from the gateway's config."},
        "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 128},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "seed": {"type": ["integer", "null"]},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "stop": {"anyOf": [STRING, {"type": "array", "items": STRING}, {"type": "null"}]},
        "tools": {"type": "array", "items": OBJECT},
        "tool_choice": {"anyOf": [STRING, OBJECT]},
        "response_format": OBJECT,
        "logit_bias": OBJECT,
        "metadata": OBJECT,
        "reasoning_effort": STRING,
        "user": STRING,
    },
    "example": {
        "model": "demo",
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 64,
    },
}

CHAT_COMPLETION: Schema = {
    "type": "object",
    "required": ["id", "object", "choices"],
    "properties": {
        "id": STRING,
        "object": {"const": "chat.completion"},
        "model": STRING,
        "choices": {"type": "array", "items": OBJECT},
        "usage": {"type": ["object", "null"]},
    },
}

# -- Anthropic Messages --------------------------------------------------------------------------

ANTHROPIC_BLOCK: Schema = {"type": "object", "required": ["type"], "properties": {"type": STRING}}

MESSAGES_REQUEST: Schema = {
    "type": "object",
    "description": "Anthropic's Messages API. Other top-level fields of Anthropic's"
    " (`context_management`, `container`, `mcp_servers`, ...) reach Anthropic deployments as"
    " sent; any other deployment refuses each by name (400 `unsupported_parameter`).",
    "required": ["model", "messages", "max_tokens"],
    "properties": {
        "model": {"type": "string", "description": "A model alias from the gateway's config."},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["user", "assistant", "system"]},
                    "content": {
                        "anyOf": [STRING, {"type": "array", "items": ANTHROPIC_BLOCK}],
                    },
                },
            },
        },
        "max_tokens": {"type": "integer", "minimum": 1},
        "system": {
            "anyOf": [
                STRING,
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": STRING},
                    },
                },
                {"type": "null"},
            ]
        },
        "stream": {"type": ["boolean", "null"]},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "top_k": {"type": ["integer", "null"], "minimum": 0},
        "stop_sequences": {"type": ["array", "null"], "items": STRING},
        "tools": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "required": ["name", "input_schema"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "description": NULLABLE_STRING,
                    "input_schema": OBJECT,
                },
            },
        },
        "tool_choice": {
            "type": ["object", "null"],
            "required": ["type"],
            "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": STRING},
        },
        "thinking": {
            "type": ["object", "null"],
            "required": ["type"],
            "properties": {
                "type": STRING,
                "budget_tokens": {"type": ["integer", "null"], "minimum": 1024},
            },
        },
        "metadata": {"type": ["object", "null"], "properties": {"user_id": NULLABLE_STRING}},
    },
    "example": {
        "model": "demo",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hello"}],
    },
}

ANTHROPIC_MESSAGE: Schema = {
    "type": "object",
    "required": ["id", "type", "role", "content"],
    "properties": {
        "id": STRING,
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "content": {"type": "array", "items": ANTHROPIC_BLOCK},
    },
}

# -- OpenAI Responses ----------------------------------------------------------------------------

RESPONSES_REQUEST: Schema = {
    "type": "object",
    "description": "The OpenAI Responses API; only function tools are supported.",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "description": "A model alias from the gateway's config."},
        "input": {
            "anyOf": [
                STRING,
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "type": {
                                "enum": [
                                    "message",
                                    "function_call",
                                    "function_call_output",
                                    "reasoning",
                                ]
                            },
                            "role": {"enum": ["user", "assistant", "system", "developer"]},
                        },
                    },
                },
            ]
        },
        "instructions": NULLABLE_STRING,
        "tools": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {
                    "type": {"const": "function"},
                    "name": {"type": "string", "minLength": 1},
                    "description": NULLABLE_STRING,
                    "parameters": {"type": ["object", "null"]},
                    "strict": {"type": ["boolean", "null"]},
                },
            },
        },
        "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, OBJECT]},
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "previous_response_id": NULLABLE_STRING,
        "conversation": {
            "anyOf": [
                STRING,
                {"type": "object", "required": ["id"], "properties": {"id": STRING}},
            ]
        },
        "store": {"type": "boolean"},
        "stream": {"type": ["boolean", "null"]},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "reasoning": {
            "type": ["object", "null"],
            "properties": {"effort": NULLABLE_STRING, "summary": NULLABLE_STRING},
        },
        "text": {"type": ["object", "null"]},
        "metadata": {"type": ["object", "null"], "additionalProperties": STRING},
        "user": NULLABLE_STRING,
    },
    "example": {"model": "demo", "input": "Give me three tips."},
}

RESPONSE: Schema = {
    "type": "object",
    "required": ["id", "object", "status", "output"],
    "properties": {
        "id": STRING,
        "object": {"const": "response"},
        "status": {"enum": ["completed", "incomplete", "in_progress", "failed", "cancelled"]},
        "output": {"type": "array", "items": OBJECT},
    },
}

# -- the rest ------------------------------------------------------------------------------------

EMBEDDINGS_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "description": "A model alias from the gateway's config."},
        "input": {"anyOf": [STRING, {"type": "array", "minItems": 1}]},
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": STRING,
    },
    "example": {"model": "demo", "input": "The food was delicious."},
}

COMPLETION_REQUEST: Schema = {
    "type": "object",
    "description": "OpenAI's legacy Completions API; one prompt a request. Other fields are"
    " forwarded; `suffix`, `echo`, `best_of` and `logprobs` only to deployments that serve"
    " `/completions` themselves.",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string", "description": "A model alias from the gateway's config."},
        "prompt": {
            "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1, "maxItems": 1}]
        },
        "stream": {"type": ["boolean", "null"]},
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    },
    "example": {"model": "demo", "prompt": "Say this is a test", "max_tokens": 16},
}

TEXT_COMPLETION: Schema = {
    "type": "object",
    "required": ["id", "object", "choices"],
    "properties": {
        "id": STRING,
        "object": {"const": "text_completion"},
        "choices": {"type": "array"},
    },
}

ITEM: Schema = {
    "type": "object",
    "description": "A conversation item: a message, function_call or function_call_output.",
    "properties": {
        "type": {"enum": ["message", "function_call", "function_call_output"]},
        "role": {"enum": ["user", "assistant", "system", "developer"]},
    },
}

METADATA: Schema = {
    "type": ["object", "null"],
    "maxProperties": 16,
    "propertyNames": {"maxLength": 64},
    "additionalProperties": {"type": "string", "maxLength": 512},
}

NEW_CONVERSATION: Schema = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": ITEM}, "metadata": METADATA},
    "example": {"items": [{"type": "message", "role": "user", "content": "Hi"}]},
}

CONVERSATION_UPDATE: Schema = {
    "type": "object",
    "required": ["metadata"],
    "additionalProperties": False,
    "properties": {"metadata": METADATA},
    "example": {"metadata": {"topic": "billing"}},
}

NEW_ITEMS: Schema = {
    "type": "object",
    "required": ["items"],
    "properties": {"items": {"type": "array", "items": ITEM}},
}

NEW_BRANCH: Schema = {
    "type": "object",
    "required": ["at_seq"],
    "properties": {"at_seq": {"type": "integer", "minimum": 0}},
}

TRUNCATE: Schema = {
    "type": "object",
    "required": ["content_chars"],
    "properties": {
        "content_chars": {
            "type": "integer",
            "minimum": 0,
            "description": "How many characters (Unicode code points) of the answer's text"
            " (its text blocks joined, not its reasoning) the client showed. At most what was"
            " delivered, and what an earlier truncate left.",
        }
    },
    "example": {"content_chars": 42},
}

CANCEL: Schema = {
    "type": "object",
    "description": "Optional: with `content_chars`, the interrupted answer is truncated to what"
    " the client showed once the turn has ended.",
    "properties": {"content_chars": {**TRUNCATE["properties"]["content_chars"]}},
}

TRUNCATION: Schema = {
    "type": "object",
    "required": [
        "object",
        "conversation_id",
        "turn_id",
        "seq",
        "message_seq",
        "content_chars",
        "delivered_chars",
        "content",
    ],
    "properties": {
        "object": {"const": "conversation.turn.truncation"},
        "conversation_id": STRING,
        "turn_id": STRING,
        "seq": {"type": "integer", "description": "The `assistant/truncate` event's seq"},
        "message_seq": {"type": "integer", "description": "The truncated message's seq"},
        "content_chars": {"type": "integer", "minimum": 0},
        "delivered_chars": {"type": "integer", "minimum": 0},
        "content": {"type": "string", "description": "The answer's text as it is now"},
    },
}

TURN_CANCELLATION: Schema = {
    "type": "object",
    "required": ["object", "conversation_id", "turn_id", "status"],
    "properties": {
        "object": {"const": "conversation.turn.cancellation"},
        "conversation_id": STRING,
        "turn_id": STRING,
        "status": {
            "enum": ["interrupted", "completed", "error"],
            "description": "How the turn ended: `interrupted`, its answer the delivered prefix;"
            " `completed` when the whole answer had already reached the client; `error` when"
            " its upstream failed first.",
        },
    },
}

CHAT_CANCELLATION: Schema = {
    "type": "object",
    "required": ["id", "object", "status"],
    "properties": {
        "id": STRING,
        "object": {"const": "chat.completion.cancellation"},
        "status": {"const": "cancelled"},
        "truncation": TRUNCATION,
    },
}

MODEL: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": STRING,
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": STRING,
        "context_window": {"type": "integer", "minimum": 1},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "input_modalities": {"type": "array", "items": STRING},
        "output_modalities": {"type": "array", "items": STRING},
        "pricing": {
            "type": "object",
            "description": "USD per million tokens, the dearest deployment's",
            "properties": {
                "input_per_mtok": {"type": "number"},
                "output_per_mtok": {"type": "number"},
                "cache_read_per_mtok": {"type": "number"},
                "cache_write_per_mtok": {"type": "number"},
            },
        },
    },
}

TOKEN_COUNT_REQUEST: Schema = {
    **{k: v for k, v in MESSAGES_REQUEST.items() if k not in ("required", "description")},
    "description": "A Messages request to count (no `max_tokens` needed).",
    "required": ["model", "messages"],
}

TOKEN_COUNT: Schema = {
    "type": "object",
    "required": ["input_tokens"],
    "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
}

LIST: Schema = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
}


def components() -> dict[str, Schema]:
    return {
        "Error": ERROR,
        "AnthropicError": ANTHROPIC_ERROR,
        "ChatMessage": CHAT_MESSAGE,
        "ChatCompletionRequest": CHAT_REQUEST,
        "ChatCompletion": CHAT_COMPLETION,
        "MessagesRequest": MESSAGES_REQUEST,
        "AnthropicMessage": ANTHROPIC_MESSAGE,
        "ResponsesRequest": RESPONSES_REQUEST,
        "Response": RESPONSE,
        "EmbeddingsRequest": EMBEDDINGS_REQUEST,
        "CompletionRequest": COMPLETION_REQUEST,
        "TextCompletion": TEXT_COMPLETION,
        "NewConversation": NEW_CONVERSATION,
        "ConversationUpdate": CONVERSATION_UPDATE,
        "NewItems": NEW_ITEMS,
        "NewBranch": NEW_BRANCH,
        "Truncate": TRUNCATE,
        "Cancel": CANCEL,
        "Truncation": TRUNCATION,
        "ChatCompletionCancellation": CHAT_CANCELLATION,
        "TurnCancellation": TURN_CANCELLATION,
        "List": LIST,
        "Model": MODEL,
        "TokenCountRequest": TOKEN_COUNT_REQUEST,
        "TokenCount": TOKEN_COUNT,
        "Principal": PRINCIPAL,
        "OwnLimits": OWN_LIMITS,
        **_pydantic(NewTeam, TeamChanges, NewKey, KeyChanges, KeyRotation, Limits),
    }
