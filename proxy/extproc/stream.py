"""One HTTP exchange as Envoy streams it to the processor, phase by phase, answered with what the guard decides.

request headers   the route table's verdict (exchange/entry.py): a refusal, the guard's own probes and metrics
                  are answered here; other routes go on (a guarded one once its body is decided), with the
                  gateway's changes to their headers (gateway.py: credentials, a client's destination, `:path`)
request body      BUFFERED: the whole body in one message; FULL_DUPLEX_STREAMED: pieces gathered (at most
                  server.max_body_bytes), the headers held until the body is decided, then the body sent back in
                  pieces. Either must come within server.read_timeout_s of the headers (408). The guard decides
                  (exchange/flow.py): pass goes on untouched, a rewrite (clamp, truncate) replaces the body with
                  its content-length, a refusal or count_tokens is answered here; a forwarded request is first
                  admitted by its KV cost
request trailers  never go on (every one is taken off); they end a body still undecided, an absent one too (an
                  HTTP/2 request of headers then trailers is decided on its empty body)
response phase    the answer's headers and body, and the stream's end (Envoy closes it when the HTTP exchange ends,
                  completed or aborted): answering.py
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from urllib.parse import unquote

from proxy import error_bodies
from proxy.api.honoured import header_changes
from proxy.api.routes import Found, Kind
from proxy.error_bodies import Envelope
from proxy.errors import (
    GuardError,
    GuardUnavailable,
    InvalidRequest,
    internal_error,
)
from proxy.exchange.core import Core
from proxy.exchange.entry import Refusal, target
from proxy.exchange.headers import Headers, RawHeaders, encode_headers
from proxy.exchange.own import own_answer
from proxy.exchange.record import REQUEST_ID, request_id
from proxy.exchange.request import Request
from proxy.extproc import wire
from proxy.extproc.answering import JSON, Answering, Answers
from proxy.extproc.body import Gathered
from proxy.extproc.gateway import Gateway, Upward
from proxy.extproc.wire import BUFFERED, FULL_DUPLEX, NONE, STREAMED, HttpHeaders, ProcessingRequest, ProcessingResponse
from proxy.policy.outcome import Forward

log = logging.getLogger("token_guard.extproc")

HEADERS, BODY, TRAILERS = "headers", "body", "trailers"  # the message a request's decision answers
OWN_DETAILS = {"/metrics": "token_guard_metrics", "/livez": "token_guard_alive"}  # Envoy's response code details


class Stream:
    def __init__(self, core: Core, gateway: Gateway, max_body_bytes: int) -> None:
        self.core, self.gateway = core, gateway
        self.request_mode, self.response_mode = BUFFERED, NONE  # the body modes Envoy says it uses (ProcessingMode)
        self.request: Request | None = None  # from the route table's pass on
        self.sent: Headers = []  # the request's headers as received
        self.tagged: Headers = []  # the request id, for the answers the route table makes before there is a Request
        self.upward: Upward = gateway.fixed  # what the request's headers get on their way upstream
        # the body's share of those held at once, given back at the stream's end
        self.body = Gathered(core.bodies.hold(), max_body_bytes, gateway.read_timeout_s)
        self.answering = Answering()  # the answer's status, end, usage and ticket (answering.py)
        self.forwarded = False  # a guarded request's answer that sends it on was made

    async def run(self, requests: AsyncIterator[ProcessingRequest]) -> AsyncIterator[Answers]:
        """The answers to Envoy's messages, each as it comes. A guarded body still to come at its deadline is
        answered 408, as serve answers it, and the stream ends."""
        messages = aiter(requests)
        while True:
            try:
                if self.body.deadline is None:
                    message = await anext(messages)
                else:
                    async with asyncio.timeout_at(self.body.deadline):
                        message = await anext(messages)
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield await self._failed(self.body.late())
                return
            yield await self.answer(message)
            if self.answering.here:  # ended here rather than when Envoy closes it: what it held comes back at once
                return

    async def answer(self, message: ProcessingRequest) -> Answers:
        phase = message.WhichOneof("request")
        if message.HasField("protocol_config"):  # on the stream's first message
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        request, mode = self.request, self.response_mode
        try:
            if phase == "request_headers":
                return await self._request_headers(message.request_headers)
            if phase == "request_body":
                return await self._request_body(message.request_body.body, message.request_body.end_of_stream)
            if phase == "response_headers":
                return self.answering.headers(request, message.response_headers, mode, self.tagged)
            if phase == "response_body":
                body = message.response_body
                return await self.answering.body(request, body.body, body.end_of_stream, mode)
            if phase == "request_trailers":
                return await self._request_trailers(message.request_trailers)
        except GuardError as exc:
            return await self._failed(exc)
        except Exception:
            log.exception("unexpected error in the external processor (request %s)",
                          self.request.record.request_id if self.request else None)  # fmt: skip
            return await self._failed(internal_error())
        return [wire.response_trailers()]

    async def _request_headers(self, message: HttpHeaders) -> Answers:
        self.sent = sent = wire.headers_of(message.headers)
        pseudo = {k: v for k, v in sent if k[:1] == b":"}
        method = pseudo.get(b":method", b"GET").decode("latin-1")
        raw_path, mark, query = pseudo.get(b":path", b"/").partition(b"?")
        rid = request_id(next((v.decode("latin-1") for k, v in sent if k == REQUEST_ID), None))
        self.tagged = [(REQUEST_ID, rid.encode())]
        inner = self.gateway.unprefixed(raw_path) if self.gateway.prefixes else None
        if inner is not None:  # guarded as the path vLLM receives: the processor takes the gateway's prefix off
            raw_path, self.upward = inner, self.gateway.upward(inner + mark + query)
        path = unquote(raw_path.decode("latin-1"))  # as uvicorn decodes it for serve
        refused = target(raw_path, path, query, None, pseudo.get(b":authority"))
        entered = refused or self.core.door.enter(method, path, sent, bodiless=message.end_of_stream)
        if isinstance(entered, Refusal):
            return [await self._refused(entered.logged(method, rid))]
        found = entered.found
        if found.path != raw_path.decode("latin-1"):  # what Envoy forwards is the path as sent: only the route's own
            return [await self._refused(Refusal(_not_own(found), closing=True).logged(method, rid))]
        if found.route.kind is Kind.OWN:  # the guard's own probes and metrics, answered here rather than by vLLM
            status, content_type, body = await own_answer(self.core, found.route.path, sent)
            details = OWN_DETAILS.get(found.route.path, "token_guard_health")
            return [self.answering.immediate(status, [(b"content-type", content_type)], body, details)]
        guarded = found.route.guarded and not entered.preflight
        request = self.request = Request.begin(self.core, found.route, entered.key, rid, method, guarded, sent)
        if not guarded:
            entry = await request.reached(path)  # a stored response's: its key's only, sent to its replica
            if request.limited:  # a request of its minute's, no token (as serve)
                await request.charge_one()
            return [self._onward([*self.tagged, *self.gateway.endpoints.pinning(entry.replica if entry else None)])]
        declared = next((v for k, v in sent if k == b"content-length"), b"")
        self.body.check(declared)
        if self.request_mode not in (BUFFERED, FULL_DUPLEX) and not message.end_of_stream:
            raise GuardError("token-guard extproc takes request bodies BUFFERED or FULL_DUPLEX_STREAMED only.")
        if message.end_of_stream:  # no body: decided now, from nothing (a guarded route answers it 400)
            return await self._decide(b"", HEADERS)
        self.body.expect()
        if self.request_mode == FULL_DUPLEX:
            return []  # the headers are held until the body is decided
        # BUFFERED sends no body message for a body of no bytes: without a length, the trailers may be its only end
        unsized = not declared.isdigit() or int(declared) == 0
        return [self._onward(trailers_of=self.response_mode if unsized else None)]

    async def _request_body(self, piece: bytes, end: bool) -> Answers:
        if not self.body.pending:  # a body a relay route carries on unread
            return list(wire.streamed(piece, end)) if self.request_mode == FULL_DUPLEX else [wire.request_body()]
        self.body.add(piece)
        if not end and self.request_mode == FULL_DUPLEX:  # BUFFERED's one message is the whole body, trailers or not
            return []
        return await self._decide(self.body.take(), BODY)

    async def _request_trailers(self, message: HttpHeaders) -> Answers:
        """Trailers never reach the upstream; they end a guarded body still undecided (an empty one if none came)."""
        cleared = wire.request_trailers([k.decode("latin-1") for k, _ in wire.headers_of(message.trailers)])
        if not self.body.pending:
            return [cleared]
        answers = await self._decide(self.body.take(), TRAILERS)
        return answers if self.answering.ended else [*answers, cleared]

    def _onward(
        self, headers: RawHeaders = (), remove: tuple[str, ...] = (), trailers_of: int | None = None
    ) -> ProcessingResponse:
        """Go on with the request's headers: the gateway's changes, `headers` set and `remove` taken off."""
        upward = self.upward
        return wire.request_headers([*upward.set, *headers], (*upward.removed, *remove), trailers_of)

    async def _decide(self, body: bytes, at: str) -> Answers:
        """The guard's decision on the whole `body`, answering the message `at` which it ended: HEADERS (it has none),
        BODY or TRAILERS."""
        assert self.request is not None
        hides = self.response_mode in (STREAMED, FULL_DUPLEX)  # the answer's pieces pass here, to be changed
        outcome = await self.core.flow.decide(self.request, body, self._headers(), _here, hides)
        if isinstance(outcome, Forward):
            return await self._forward(self.request, outcome, body, at)
        return [self.answering.decided(self.request, outcome)]

    async def _forward(self, request: Request, outcome: Forward, body: bytes, at: str) -> Answers:
        self.forwarded, self.answering.follows = True, outcome.follows
        # a background response's ticket is on the pinned replica: followed there
        excluded, pin = await self.gateway.endpoints.placed(request.recording(), self.sent)
        if outcome.cost is not None:
            self.answering.ticket = ticket = await request.admitted_for(outcome.cost, excluded)
            request.admitted(ticket)
        if request.record.charge is not None:  # admitted, it goes on to the upstream: the key pays from here
            request.record.charge.hand(True)
        pinned, stripped = header_changes(request.route.reads, self._headers())
        decided = [*self.tagged, *request.decided, *encode_headers(pinned), *pin]
        if outcome.content_type is not None:  # a form written anew: its own boundary, in place of every one sent
            decided.append((b"content-type", outcome.content_type.encode("latin-1")))
        changed = outcome.body is not body
        if at == HEADERS:  # nothing follows the headers
            return [self._onward(decided, remove=stripped)]
        if self.request_mode == FULL_DUPLEX:  # the headers were held: they go on now, and the body after them
            return [self._onward(decided, remove=("content-length", *stripped)), *wire.streamed(outcome.body, True)]
        if at == TRAILERS:  # BUFFERED, no body came: the headers went on already, and there is nothing to replace
            return []
        if changed:
            decided.append((b"content-length", str(len(outcome.body)).encode()))
        return [wire.request_body(outcome.body if changed else None, decided, remove=stripped)]

    def _headers(self) -> dict[str, str]:
        """The request's headers as the guard reads them: one value each (the last of a repeated one)."""
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.sent if k[:1] != b":"}

    async def close(self) -> None:
        """The stream ended (Envoy closed it, or it was cancelled): what the request held is given back."""
        self.body.held.release()
        await self.answering.close(self.request, self._headers())

    @property
    def decided(self) -> bool:
        """The request was sent on (guarded and forwarded, or a route the guard does not read) or answered here: a
        stream that ends cleanly before that lets Envoy send the request on unprocessed."""
        relayed = self.request is not None and not self.request.record.guarded
        return self.forwarded or self.answering.status is not None or relayed

    async def cut(self) -> Answers:
        """The drain's end came while Envoy waits for an answer and the client has had nothing: a 503."""
        return await self._failed(GuardUnavailable.stopping())

    async def _failed(self, error: GuardError) -> Answers:
        request = self.request
        if request is not None:
            await request.tell()
        tagged = request.tagged if request is not None else self.tagged
        envelope = request.route.envelope if request is not None else Envelope.OPENAI
        headers, body = error_bodies.answer(error, [*tagged, *JSON], envelope)
        return [self.answering.immediate(error.status, headers, body, "token_guard_error")]

    async def _refused(self, refusal: Refusal) -> ProcessingResponse:
        told = encode_headers(await refusal.headers(self.core.quotas))
        headers, body = error_bodies.answer(refusal.error, [*self.tagged, *told, *JSON], refusal.envelope)
        return self.answering.immediate(refusal.error.status, headers, body, "token_guard_route")


def _here() -> None:
    """A client that leaves cancels the stream's task: nothing to ask before counting."""


def _not_own(found: Found) -> InvalidRequest:
    return InvalidRequest(f"The request target is not accepted: behind Envoy only a route's own path is; send "
                          f"{found.path}.", code="invalid_request_target")  # fmt: skip
