"""Stored responses on the request path, whatever the front end: the ledger (policy/ledger.py) built from the
settings, the owner a request speaks for, the replica a request naming a stored response must reach, and each
stored response recorded from its answer as it is relayed (the JSON body, or the stream's `response.completed`, or
0.33's `response.incomplete`), before the answer's last bytes reach the client, so that a next turn sent at once
finds it."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from proxy.api.routes import Route
from proxy.errors import ResponseNotFound
from proxy.exchange.headers import RawHeaders
from proxy.exchange.keys import ApiKeys, given_key
from proxy.policy.continued import PLAIN_ID
from proxy.policy.decide import Action
from proxy.policy.ledger import NOBODY, Ledger, MemoryLedger, Stored, Turn, recorded
from proxy.policy.outcome import Findings
from proxy.settings import Settings
from proxy.upstream.transport import Answer

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink

log = logging.getLogger("token_guard.responses")

ID_ROUTES = frozenset({"/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"})
ENDED = (b"event: response.completed", b"event: response.incomplete")  # incomplete: 0.33+, cut at its limit
ANSWER_BYTES = 8 * 2**20  # the most of one answer held to read its response: past it, recorded without its conversation
SEPARATOR = b"\n\n"


def ledger_for(settings: Settings, link: RedisLink | None) -> Ledger:
    responses = settings.responses
    if link is None:
        return MemoryLedger(responses.ttl_s, responses.max_bytes)
    from proxy.fleet.ledger import RedisLedger

    return RedisLedger(link, responses.ttl_s, responses.max_bytes)


def owner_of(keys: ApiKeys, headers: RawHeaders) -> str:
    """Whom a request's stored responses belong to: the SHA-256 of the client key it carries, or NOBODY where the
    guard checks no client key."""
    if not keys:
        return NOBODY
    given = given_key(headers)
    return given.hex() if given is not None else NOBODY


def named_id(route: Route, path: str) -> str | None:
    """The response id in the path of a route that takes one (retrieve, cancel); None for any other route."""
    if route.path not in ID_ROUTES:
        return None
    return path.removeprefix("/v1/responses/").removesuffix("/").removesuffix("/cancel")


async def reach(ledger: Ledger, response_id: str, owner: str) -> Stored | None:
    """The entry a retrieve or cancel reaches (its replica answers it); None: the ledger does not know it and no key
    is checked (any replica). ResponseNotFound for another key's, or for one the ledger does not know where keys are
    checked: the guard cannot tell whose it is."""
    entry = await ledger.find(response_id)
    if entry is None and owner == NOBODY:
        return None
    if entry is None or entry.owner != owner:
        raise ResponseNotFound(response_id)
    return entry


def recorder_for(ledger: Ledger, findings: Findings, limit: int) -> Recorder | None:
    """The recorder of a guarded request the ledger follows (a Responses create vLLM stores, or one continuing a
    stored response); None for any other."""
    turn, decision = findings.turn, findings.decision
    if turn is None:
        return None
    exact = decision is not None and decision.action != Action.TRUNCATE  # the guard's cut: not what it counted whole
    return Recorder(ledger, turn, turn.previous, limit, exact)


class Recorder:
    """Taps one answer to a create vLLM stores, and records its response in the ledger from it; forgets the entry a
    request named when that entry's replica answers 404 for it (it restarted, its store is gone)."""

    def __init__(self, ledger: Ledger, turn: Turn | None, named: Stored | None, limit: int, exact: bool) -> None:
        """`named`: the entry the request reaches (continued, retrieved, cancelled); `limit`: the most bytes of an
        answer held to read it; `exact`: the messages of `turn` are what was forwarded (not cut by the guard)."""
        self.ledger, self.turn, self.named, self.limit = ledger, turn, named, min(limit, ANSWER_BYTES)
        self.messages = turn.messages if turn is not None and exact else None
        self.url = ""
        self._held: list[bytes] = []
        self._size = 0
        self._over = False  # more than `limit` bytes to hold: the conversation is not read
        self._recorded = False
        self._status = 0
        self._gone = False  # the replica said it does not hold the named response

    @property
    def replica(self) -> str | None:
        """The replica the request must reach; None: any (an entry recorded where the replica was not known)."""
        return self.named.replica or None if self.named is not None else None

    def reads(self, status: int) -> bool:
        """Whether an answer of `status` is read: a create vLLM stores, answered 200 (recorded), or a 404 to a
        request that named a stored response (vLLM's "not found" for it: its replica restarted, so it is forgotten)."""
        self._status = status
        recorded = self.turn is not None and self.turn.store and status == 200
        return recorded or (status == 404 and self.named is not None)

    def tap(self, answer: Answer) -> Answer:
        if not self.reads(answer.status):
            return answer
        self.url = self.url or answer.url
        return _Tapped(answer, self)

    async def answered(self) -> None:
        if self._gone and self.named is not None:
            await self.ledger.drop(self.named.id)

    async def read(self, piece: bytes, sse: bool) -> None:
        if self._status == 404:  # vLLM's words for an id its store does not hold (a small JSON body, one piece)
            self._gone = self._gone or b"Response with id '" in piece
            return
        if self._recorded or self._over:
            return
        if self._size + len(piece) > self.limit:
            self._over, self._held = True, []
            return
        self._held.append(piece)
        self._size += len(piece)
        if not sse:
            return
        *events, rest = b"".join(self._held).split(SEPARATOR)
        self._held, self._size = ([rest], len(rest)) if rest else ([], 0)
        for event in events:
            if event.startswith(ENDED):
                await self._record(_data(event), final=True)
            elif b"response.created" in event[:40]:  # the id, known before the end: its owner and replica already
                await self._record(_data(event), final=False)

    async def end(self, sse: bool) -> None:
        if self._status == 200 and not sse and not self._over and not self._recorded:
            await self._record(_json(b"".join(self._held)), final=True)

    async def _record(self, body: Any, final: bool) -> None:
        response = body.get("response", body) if isinstance(body, dict) else None
        if not isinstance(response, dict) or self.turn is None:
            return
        rid = response.get("id")
        if not isinstance(rid, str) or not PLAIN_ID.fullmatch(rid):
            return
        self._recorded = final
        output = response.get("output") if final else None
        await self.ledger.put(recorded(self.turn, rid, self.url, self.messages, output))


class _Tapped(Answer):
    """An answer whose pieces the recorder reads as they pass; the last piece of a JSON body is held until its
    response is recorded."""

    def __init__(self, inner: Answer, recorder: Recorder) -> None:
        self.inner, self.recorder = inner, recorder
        self.url, self.status, self.raw_headers = inner.url, inner.status, inner.raw_headers
        self.headers, self.content_type, self.is_sse = inner.headers, inner.content_type, inner.is_sse

    async def first(self) -> bytes:
        return await self.inner.first()

    async def pieces(self) -> AsyncGenerator[bytes, None]:
        recorder, sse, last = self.recorder, self.is_sse, b""
        async for piece in self.inner.pieces():
            await recorder.read(piece, sse)
            if sse:
                yield piece
                continue
            if last:
                yield last
            last = piece
        await recorder.end(sse)
        if last:
            yield last

    def close(self) -> None:
        self.inner.close()


def _data(event: bytes) -> Any:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return _json(line[5:])
    return None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
