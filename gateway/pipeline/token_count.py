"""POST /v1/messages/count_tokens: how many input tokens a Messages request would take.

Exact where the alias routes to Anthropic, which counts for free: the client's body (its model
replaced) and its `anthropic-version` and `anthropic-beta` go to the first Anthropic deployment
of the plan that answers. Otherwise, or when none answers, the gateway's own tokenizer
estimates it (cl100k_base over the system prompt, messages and tools, images and documents by
their provider's rules: gateway.metering.tokens), and the answer says so in
`X-Gateway-Token-Count: estimated`. Nothing is recorded or metered (no model is called), but
the key must be allowed the model, as for a completion.
"""

from __future__ import annotations

import orjson

from gateway.context import Gateway
from gateway.dialects.anthropic_messages import parse_request
from gateway.dialects.requests import parse_json_object
from gateway.errors import UpstreamError
from gateway.metering.keys import Principal
from gateway.metering.tokens import count_text, tally_messages, vendor_of

ESTIMATED = "estimated"
EXACT = "provider"


async def count_tokens(
    gateway: Gateway, principal: Principal, raw: bytes, headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """The answer's JSON (`{"input_tokens": N}`) and its headers."""
    body = parse_json_object(raw)
    # Validated as a Messages request is, less the output bound a count has no use for.
    chat, _ = parse_request(orjson.dumps({"max_tokens": 1, **body}))
    alias = gateway.routes.alias(chat.get("model"), principal)
    plan = gateway.routes.plan(alias, chat)
    for deployment in plan:
        counter = getattr(deployment.provider, "count_tokens", None)
        if counter is None:
            continue
        try:
            answer: bytes = await counter(body, headers)
        except UpstreamError as error:
            if error.retryable:
                continue  # the next Anthropic deployment, else the estimate
            raise
        return answer, {"X-Gateway-Deployment": deployment.name, "X-Gateway-Token-Count": EXACT}
    first = plan[0]
    vendor = vendor_of(first.provider_name, first.upstream_model)
    tokens = tally_messages(chat["messages"]).tokens(vendor, first.upstream_model)
    tokens += count_text(orjson.dumps(body.get("tools")).decode()) if body.get("tools") else 0
    answer = orjson.dumps({"input_tokens": tokens})
    return answer, {"X-Gateway-Deployment": first.name, "X-Gateway-Token-Count": ESTIMATED}
