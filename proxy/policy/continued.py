"""A Responses create read against the ledger of stored responses (ledger.py): the entry its `previous_response_id`
continues, held to the key that created it, and a client-chosen `request_id` that would replace another key's
stored response refused.

    previous_response_id known, this key's      counted with the stored conversation; sent to its replica
    known, another key's                        404, vLLM's own "not found" (the key learns nothing of it)
    unknown, the guard checks keys              404: the guard cannot tell whose it is (created before the guard
                                                started, or forgotten), so no key reaches it
    unknown, no key checked                     counted as partial (the stored part unseen), any replica
"""

from __future__ import annotations

import re
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.responses import ResponsesRequest
from proxy.api.routes import ID
from proxy.counting.harmony import HarmonyChat
from proxy.counting.harmony_responses import harmony_chat
from proxy.counting.responses import responses_chat
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import InvalidRequest, ResponseNotFound
from proxy.policy.ledger import NOBODY, Ledger, Stored

PLAIN_ID = re.compile(ID)


async def continued(ledger: Ledger, req: ResponsesRequest, owner: str) -> Stored | None:
    """The entry `req` continues (None: it continues none, or one the ledger does not know and no key is checked).
    Raises ResponseNotFound for one this key may not reach, InvalidRequest for a `request_id` that is another's.
    Only ids of the route table's shape are looked up: the ledger records no other (nor can a path name one)."""
    if req.request_id is not None and req.store and PLAIN_ID.fullmatch(req.request_id):
        taken = await ledger.find(req.request_id)
        if taken is not None and taken.owner != owner:
            raise InvalidRequest(
                f"request_id '{req.request_id}' is taken: leave it out and vLLM makes a new one.", param="request_id"
            )
    previous = req.previous_response_id
    if previous is None:
        return None
    entry = await ledger.find(previous) if PLAIN_ID.fullmatch(previous) else None
    if entry is None:
        if owner != NOBODY:
            raise ResponseNotFound(previous)
        return None
    if entry.owner != owner:
        raise ResponseNotFound(previous)
    return entry


def continued_chat(
    tok: ModelTokenizer, req: ResponsesRequest, newer: bool, entry: Stored | None
) -> tuple[ChatRequest, list[dict[str, Any]] | None]:
    """The chat request vLLM renders for `req`, with the conversation of the `entry` it continues, and the messages
    its response is recorded with; those are None when a stored part is not known (the count is `partial`): the
    entry's conversation was not recorded, or not in the form the model renders (chat messages for a template,
    harmony messages for gpt-oss)."""
    continues, fills = req.previous_response_id is not None, tok.fills_response_items
    if isinstance(tok.native, HarmonyChat):
        stored = entry.harmony if entry is not None else None
        if continues and stored is None:
            return responses_chat(req, newer, fills=fills), None
        chat = harmony_chat(tok.native, req, newer, stored, tok.effort_map, fills)
        return chat, chat.harmony
    history = entry.history if entry is not None else None
    chat = responses_chat(req, newer, history, fills)
    return chat, None if continues and history is None else chat.messages
