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

from proxy.api.responses import ResponsesRequest
from proxy.api.routes import ID
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
