"""`item_reference` input items: an item id the gateway issued, read back as the item it names.

Clients that keep state on the server (the Vercel AI SDK's Responses provider with `store` on,
its default) send earlier output back as `{"type": "item_reference", "id": ...}` instead of the
item. Nothing is stored per item: each id the gateway issues says where its item is.

- A Response's output item (`msg_`, `rs_`, `fc_` + the response's hex + `_` + its position,
  `gateway.dialects.openai_responses`): the response is read back (`ResponseStore.get`: the
  key's team only, `store: true` only) and the item is its output item with that id, as
  `GET /v1/responses/{id}` shows it (an interrupted answer: the delivered prefix).
- A conversation item (`msg_<seq>`, `fco_<seq>`, `rs_<seq>_<i>`, `fc_<seq>_<i>`:
  `gateway.conversations.items`, the Conversations API and `input_items`): seqs are unique
  along one conversation's path only, so these resolve in the conversation the request names
  (`conversation`, `X-Conversation-Id`, or the conversation of `previous_response_id`).

Anything else, an id the key's team cannot read, or a seq id without a conversation, is a 400
naming the id, raised before anything is recorded or sent upstream. Resolved items become the
turn's input exactly as if the client had sent them inline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.conversations.items import path_items
from gateway.conversations.service import Conversations
from gateway.conversations.stored_responses import ResponseStore, answer_of
from gateway.dialects.openai_responses import (
    ResponsesRequest,
    input_messages,
    item_references,
    output_items,
    response_of_item,
    unknown_item,
)
from gateway.errors import NotFound
from gateway.metering.keys import Principal
from gateway.storage.store import Store


class ItemResolver:
    """Reads items back for one request, each response and conversation path at most once.

    `conversation_id` is the conversation the request names, where conversation item ids
    (seq-based) resolve; None when it names none."""

    def __init__(
        self,
        store: Store,
        conversations: Conversations,
        principal: Principal,
        conversation_id: str | None,
    ) -> None:
        self._conversations = conversations
        self._principal = principal
        self._conversation_id = conversation_id
        self._responses = ResponseStore(store, conversations)
        self._items: dict[str, dict[str, dict[str, Any]]] = {}  # source -> item id -> item

    async def item(self, item_id: str, where: str) -> dict[str, Any]:
        """The item `item_id` names, as an input item; a 400 naming it when there is none."""
        response_id = response_of_item(item_id)
        source = response_id or self._conversation_id
        if source is None:
            raise unknown_item(item_id, where)
        if source not in self._items:
            try:
                if response_id is not None:
                    items = await self._response_items(response_id)
                else:
                    items = await self._conversation_items(source)
            except NotFound:
                raise unknown_item(item_id, where) from None
            self._items[source] = {str(item["id"]): item for item in items}
        found = self._items[source].get(item_id)
        if found is None:
            raise unknown_item(item_id, where)
        return found

    async def _response_items(self, response_id: str) -> list[dict[str, Any]]:
        stored = await self._responses.get(response_id, self._principal)
        status, blocks, _ = answer_of(await self._responses.turn_events(stored))
        item_status = "incomplete" if status in ("cancelled", "incomplete") else "completed"
        return output_items(blocks, status=item_status, response_id=stored.id)

    async def _conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        path = await self._conversations.path(conversation_id, self._principal)
        return path_items(path)


async def resolve_item_references(
    store: Store,
    conversations: Conversations,
    principal: Principal,
    headers: Mapping[str, str],
    request: ResponsesRequest,
    new_messages: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """A Responses request's new input as chat messages, its item references resolved
    (`new_messages`, from `parse_request`, when it has none)."""
    references = item_references(request.input)
    if not references or request.input is None:
        return new_messages
    named = await _named_conversation(store, conversations, principal, headers, request)
    resolver = ItemResolver(store, conversations, principal, named)
    resolved = {item_id: await resolver.item(item_id, where) for where, item_id in references}
    return input_messages(request.input, resolved)


async def resolve_items(
    store: Store,
    conversations: Conversations,
    principal: Principal,
    conversation_id: str | None,
    items: object,
    param: str = "items",
) -> object:
    """Conversation items a client adds (`POST /v1/conversations/{id}/items`), each
    `item_reference` replaced by the item it names (seq ids resolve in `conversation_id`);
    `items` unchanged when it is not a list or has none."""
    if not isinstance(items, list) or not any(
        isinstance(item, dict) and item.get("type") == "item_reference" for item in items
    ):
        return items
    resolver = ItemResolver(store, conversations, principal, conversation_id)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            where = f"{param}[{i}]"
            item_id = item.get("id")
            if not isinstance(item_id, str) or not item_id:
                raise unknown_item(str(item_id), where)
            item = await resolver.item(item_id, where)
        out.append(item)
    return out


async def _named_conversation(
    store: Store,
    conversations: Conversations,
    principal: Principal,
    headers: Mapping[str, str],
    request: ResponsesRequest,
) -> str | None:
    """The conversation the request continues, where conversation item ids resolve: its
    `conversation`, `X-Conversation-Id` (or `metadata.conversation_id`), or the conversation
    of `previous_response_id`."""
    if request.conversation_id is not None:
        return request.conversation_id
    named = headers.get("X-Conversation-Id")
    if named:
        return named
    metadata = request.metadata or {}
    if metadata.get("conversation_id"):
        return metadata["conversation_id"]
    if request.previous_response_id is not None:
        responses = ResponseStore(store, conversations)
        try:
            previous = await responses.get(request.previous_response_id, principal)
        except NotFound:
            return None  # the request itself fails on it, with its own error
        return previous.conversation_id
    return None
