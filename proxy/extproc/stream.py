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
response headers  the x-token-guard-* and x-ratelimit-* headers, the request id, the queue time
response body     when Envoy sends it: its tail settles the key's charge from the answer's usage
the stream's end  Envoy closes it when the HTTP exchange ends, completed or aborted: the admission ticket is
                  released, the charge settled, the request's record logged; a background response's ticket and
                  charge are held on until vLLM says it ended (exchange/background.py)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from urllib.parse import unquote

from proxy import error_bodies
from proxy.api.honoured import header_changes
from proxy.api.routes import Found, Kind, Route
from proxy.error_bodies import Envelope
from proxy.errors import (
    GuardError,
    GuardUnavailable,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    internal_error,
)
from proxy.exchange.background import Followed
from proxy.exchange.core import Core
from proxy.exchange.entry import Refusal, target
from proxy.exchange.headers import Headers, RawHeaders, encode_headers
from proxy.exchange.record import REQUEST_ID, RequestRecord, request_id
from proxy.exchange.stored import Recorder, named_id, owner_of, reach, recorder_for
from proxy.extproc import wire
from proxy.extproc.endpoints import DESTINATION
from proxy.extproc.gateway import Gateway, Upward
from proxy.extproc.wire import (
    BUFFERED,
    FULL_DUPLEX,
    NONE,
    STREAMED,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from proxy.policy.outcome import Answer, Forward, Outcome, Refuse
from proxy.policy.quota import CHARGE
from proxy.policy.usage import Charge, TokenEvents
from proxy.policy.usage_event import HiddenUsage
from proxy.settings.sections import KeySettings
from proxy.upstream.admission import Ticket

log = logging.getLogger("token_guard.extproc")

JSON = [(b"content-type", b"application/json")]
QUEUE_HEADER = b"x-token-guard-queue-ms"
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
Answers = list[ProcessingResponse]
HEADERS, BODY, TRAILERS = "headers", "body", "trailers"  # the message a request's decision answers
RESPONSES = "/v1/responses"


class Stream:
    def __init__(self, core: Core, gateway: Gateway, max_body_bytes: int) -> None:
        self.core, self.gateway, self.max_body_bytes = core, gateway, max_body_bytes
        self.request_mode, self.response_mode = BUFFERED, NONE  # the body modes Envoy says it uses (ProcessingMode)
        self.record: RequestRecord | None = None  # from the route table's pass on
        self.route: Route | None = None
        self.key: KeySettings | None = None
        self.sent: Headers = []  # the request's headers as received
        self.tagged: Headers = []  # what every answer carries: the request id, the key's x-ratelimit-*
        self.extra: Headers = []  # and the decision's x-token-guard-*, once decided
        self.upward: Upward = gateway.fixed  # what the request's headers get on their way upstream
        self.pending = False  # a guarded request whose body is still to come and be decided
        self.deadline: float | None = None  # by when (the loop's clock) that body must have come
        self.pieces: list[bytes] = []
        self.size = 0
        self.held = core.bodies.hold()  # the body's share of those held at once, given back at the stream's end
        self.ticket: Ticket | None = None
        self.follows: str | None = None  # a background response's id: its ticket is held past the stream's end
        self.status: int | None = None
        self.ended = False  # the answer ended: an immediate response, or the response's last byte (or headers)
        self.hidden: HiddenUsage | None = None  # takes the usage event the guard asked for out of the answer
        self.forwarded = False  # a guarded request's answer that sends it on was made
        self.answered_here = False  # an immediate response was made: Envoy sends nothing more, the stream ends
        self.recorder: Recorder | None = None  # a stored response's: read from the answer, or forgotten on a 404
        self.sse = False  # the answer is an event stream

    async def run(self, requests: AsyncIterator[ProcessingRequest]) -> AsyncIterator[Answers]:
        """The answers to Envoy's messages, each as it comes. A guarded body still to come at its deadline is
        answered 408, as serve answers it, and the stream ends."""
        messages = aiter(requests)
        while True:
            try:
                if self.deadline is None:
                    message = await anext(messages)
                else:
                    async with asyncio.timeout_at(self.deadline):
                        message = await anext(messages)
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield await self._failed(RequestTimeout(f"The request body did not arrive within "
                                                        f"{self.gateway.read_timeout_s:g} s (server.read_timeout_s); "
                                                        f"got {self.size} bytes."))  # fmt: skip
                return
            yield await self.answer(message)
            if self.answered_here:  # ended here rather than when Envoy closes it: what it held comes back at once
                return

    async def answer(self, message: ProcessingRequest) -> Answers:
        phase = message.WhichOneof("request")
        if message.HasField("protocol_config"):  # on the stream's first message
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        try:
            if phase == "request_headers":
                return await self._request_headers(message.request_headers)
            if phase == "request_body":
                return await self._request_body(message.request_body.body, message.request_body.end_of_stream)
            if phase == "response_headers":
                return self._response_headers(message.response_headers)
            if phase == "response_body":
                return await self._response_body(message.response_body.body, message.response_body.end_of_stream)
            if phase == "request_trailers":
                return await self._request_trailers(message.request_trailers)
        except GuardError as exc:
            return await self._failed(exc)
        except Exception:
            log.exception("unexpected error in the external processor (request %s)",
                          self.record.request_id if self.record else None)  # fmt: skip
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
        found, self.key = entered.found, entered.key
        if found.path != raw_path.decode("latin-1"):  # what Envoy forwards is the path as sent: only the route's own
            return [await self._refused(Refusal(_not_own(found), closing=True).logged(method, rid))]
        route = self.route = found.route
        if route.kind is Kind.OWN:
            return [await self._own(route)]
        guarded = route.guarded and not entered.preflight
        self.record = RequestRecord(rid, method, route.path, guarded)
        self.record.findings.api_key = self.key
        if route.path.startswith(RESPONSES):  # stored responses belong to the key that created them
            self.record.findings.owner = owner_of(self.core.keys, sent)
        if not guarded:
            pinned = await self._reached(route, path)
            if self.key is not None and self.key.limited:  # a request of its minute's, no token (as serve)
                await self.core.meter.charge(self.key, 0, CHARGE, self.record, self.tagged)
            return [self._onward([*self.tagged[:1], *pinned])]
        declared = next((v for k, v in sent if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise PayloadTooLarge.over(self.max_body_bytes)
        if declared.isdigit():  # a 503 before Envoy sends a byte of it, when those held at once leave it no room
            self.held.check(int(declared))
        if self.request_mode not in (BUFFERED, FULL_DUPLEX) and not message.end_of_stream:
            raise GuardError("token-guard extproc takes request bodies BUFFERED or FULL_DUPLEX_STREAMED only.")
        if message.end_of_stream:  # no body: decided now, from nothing (a guarded route answers it 400)
            return await self._decide(b"", HEADERS)
        self.pending, self.deadline = True, asyncio.get_running_loop().time() + self.gateway.read_timeout_s
        if self.request_mode == FULL_DUPLEX:
            return []  # the headers are held until the body is decided
        # BUFFERED sends no body message for a body of no bytes: without a length, the trailers may be its only end
        unsized = not declared.isdigit() or int(declared) == 0
        return [self._onward(trailers_of=self.response_mode if unsized else None)]

    async def _reached(self, route: Route, path: str) -> Headers:
        """A retrieve or cancel of a stored response: its key's only (exchange/stored.py), and where the picker's
        header routes requests, sent to the replica that holds it; the headers that pin it."""
        response_id = named_id(route, path)
        if response_id is None or self.record is None:
            return []
        entry = await reach(self.core.ledger, response_id, self.record.findings.owner)
        self.recorder = Recorder(self.core.ledger, None, entry, 0, False)
        pinned = self.gateway.endpoints.pinned(entry.replica) if entry is not None else None
        return [(DESTINATION, pinned[1])] if pinned is not None else []

    async def _request_body(self, piece: bytes, end: bool) -> Answers:
        if not self.pending:  # a body a relay route carries on unread
            return list(wire.streamed(piece, end)) if self.request_mode == FULL_DUPLEX else [wire.request_body()]
        self.size += len(piece)
        if self.size > self.max_body_bytes:
            raise PayloadTooLarge.over(self.max_body_bytes)
        self.held.grow(self.size)
        self.pieces.append(piece)
        if not end and self.request_mode == FULL_DUPLEX:  # BUFFERED's one message is the whole body, trailers or not
            return []
        return await self._decide(self._gathered(), BODY)

    async def _request_trailers(self, message: HttpHeaders) -> Answers:
        """Trailers never reach the upstream; they end a guarded body still undecided (an empty one if none came)."""
        cleared = wire.request_trailers([k.decode("latin-1") for k, _ in wire.headers_of(message.trailers)])
        if not self.pending:
            return [cleared]
        answers = await self._decide(self._gathered(), TRAILERS)
        return answers if self.ended else [*answers, cleared]

    def _gathered(self) -> bytes:
        body, self.pieces = b"".join(self.pieces), []
        return body

    def _onward(
        self, headers: RawHeaders = (), remove: tuple[str, ...] = (), trailers_of: int | None = None
    ) -> ProcessingResponse:
        """Go on with the request's headers: the gateway's changes, `headers` set and `remove` taken off."""
        upward = self.upward
        return wire.request_headers([*upward.set, *headers], (*upward.removed, *remove), trailers_of)

    async def _decide(self, body: bytes, at: str) -> Answers:
        """The guard's decision on the whole `body`, answering the message `at` which it ended: HEADERS (it has none),
        BODY or TRAILERS."""
        assert self.record is not None and self.route is not None
        self.pending, self.deadline = False, None
        hides = self.response_mode in (STREAMED, FULL_DUPLEX)  # the answer's pieces pass here, to be changed
        outcome, self.extra = await self.core.flow.decide(self.route, body, self._headers(), self.record, self.tagged,
                                                          _here, hides)  # fmt: skip
        if isinstance(outcome, Forward):
            return await self._forward(outcome, body, at)
        return [self._finished(outcome)]

    async def _forward(self, outcome: Forward, body: bytes, at: str) -> Answers:
        assert self.record is not None
        self.forwarded, self.follows = True, outcome.follows
        excluded, pin = await self._pinned()  # a background response's ticket is on the pinned replica: followed there
        if outcome.cost is not None:
            self.ticket = await _admitted(self.core, outcome.cost, excluded)
            if self.ticket.waited_s > 0:
                self.record.queue_s = self.ticket.waited_s
                self.extra.append((QUEUE_HEADER, str(round(self.ticket.waited_s * 1000)).encode()))
        if self.record.charge is not None:  # admitted, it goes on to the upstream: the key pays from here
            self.record.charge.hand(True)
        pinned, stripped = header_changes(self.route.reads if self.route else None, self._headers())
        decided = [*self.tagged[:1], *encode_headers(outcome.decision.headers()), *encode_headers(pinned), *pin]
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

    async def _pinned(self) -> tuple[frozenset[int], Headers]:
        """The replicas a forwarded request may not be admitted on, and the headers that send it to the one that
        holds the stored response it continues, where the picker's header routes it (endpoints.py); the ledger's
        reading of its answer readied."""
        assert self.record is not None
        endpoints, findings = self.gateway.endpoints, self.record.findings
        recorder = self.recorder = recorder_for(self.core.ledger, findings, self.core.settings.responses.max_bytes)
        if recorder is None:
            return await endpoints.excluded(self.sent), []
        pinned = endpoints.pinned(recorder.replica) if recorder.replica is not None else None
        if pinned is not None:
            recorder.url = recorder.replica or ""
            return pinned[0], [(DESTINATION, pinned[1])]
        recorder.url = await endpoints.chosen(self.sent) or ""
        return await endpoints.excluded(self.sent), []

    def _headers(self) -> dict[str, str]:
        """The request's headers as the guard reads them: one value each (the last of a repeated one)."""
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.sent if k[:1] != b":"}

    def _finished(self, outcome: Outcome) -> ProcessingResponse:
        """An answer the guard gives itself: a refusal, or count_tokens' count."""
        if isinstance(outcome, Answer):
            return self._immediate(200, [*self.extra, *JSON], outcome.body, "token_guard_answered")
        assert self.route is not None
        error = outcome.error if isinstance(outcome, Refuse) else internal_error()  # Chunked: never here
        headers, body = error_bodies.answer(error, [*self.extra, *JSON], self.route.envelope)
        return self._immediate(error.status, headers, body, "token_guard_refused")

    def _response_headers(self, message: HttpHeaders) -> Answers:
        record = self.record
        self.status = wire.status_of(message.headers)
        if record is not None:
            record.upstream_first_byte_s = time.perf_counter() - record.started
            if self.status >= 500:
                record.upstream_error = f"http_{self.status}"
            if record.charge is not None and self.response_mode != NONE:  # the body comes here: read it
                self.hidden = _reading(record.charge, self.status, wire.headers_of(message.headers))
        self.ended = message.end_of_stream or self.response_mode == NONE  # no body comes: its end is not seen
        if self.recorder is not None:  # a stored response's answer is read: JSON or an event stream
            self.sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in
                           wire.headers_of(message.headers))  # fmt: skip
        return [wire.response_headers(self.extra or self.tagged)]

    async def _response_body(self, piece: bytes, end: bool) -> Answers:
        record, hidden, out = self.record, self.hidden, piece
        recorder = self.recorder
        if recorder is not None and self.status is not None and recorder.reads(self.status):
            await recorder.read(piece, self.sse)  # recorded before the answer's last bytes go on
            if end:
                await recorder.end(self.sse)
        if record is not None and record.charge is not None:
            record.charge.tail.feed(piece)
        if hidden is not None:
            out = hidden.feed(piece) + (hidden.end() if end else b"")
        if end:
            self.ended = True
            if record is not None:
                record.upstream_s = time.perf_counter() - record.started
        if self.response_mode == FULL_DUPLEX:
            return list(wire.streamed(out, end, response=True))
        return [wire.response_body(None if hidden is None else out)]

    async def close(self) -> None:
        """The stream ended (Envoy closed it, or it was cancelled): what the request held is given back."""
        self.held.release()
        record = self.record
        if self.ticket is not None:
            if self.follows is not None and self.status in (None, 200) and record is not None:
                self._hand_over(record, self.follows, self.ticket)
            else:
                self.core.upstream.release(self.ticket)
        if record is None:
            return
        if self.recorder is not None:
            await self.recorder.answered()  # vLLM's 404 from the replica that held it: forgotten
        if record.charge is not None:
            await self.core.meter.settle(record.charge, record, self.status, not self.ended)
        self.core.flow.done(record, self.status, not self.ended)

    def _hand_over(self, record: RequestRecord, follows: str, ticket: Ticket) -> None:
        """A background response vLLM runs after its answer (policy/background.py): its ticket and charge go to the
        core's followers (exchange/background.py), held until vLLM says it ended. Without the response's headers (a
        processing mode that skips them) vLLM's acceptance is not known: a refusal is seen at the first look."""
        upstream = self.core.upstream
        replica = upstream.replica_of(ticket)
        assert replica is not None
        self.core.followers.follow(Followed(follows, replica, upstream.credentials_of(self._headers()), ticket,
                                            record.charge, record))  # fmt: skip
        record.charge = None  # settled by the follower, once vLLM says what it used

    @property
    def decided(self) -> bool:
        """The request was sent on (guarded and forwarded, or a route the guard does not read) or answered here: a
        stream that ends cleanly before that lets Envoy send the request on unprocessed."""
        return self.forwarded or self.status is not None or (self.record is not None and not self.record.guarded)

    async def cut(self) -> Answers:
        """The drain's end came while Envoy waits for an answer and the client has had nothing: a 503."""
        return await self._failed(GuardUnavailable.stopping())

    async def _failed(self, error: GuardError) -> Answers:
        if self.record is not None:
            await self.core.meter.tell(self.key, self.record, self.tagged)
        envelope = self.route.envelope if self.route is not None else Envelope.OPENAI
        headers, body = error_bodies.answer(error, [*self.tagged, *JSON], envelope)
        return [self._immediate(error.status, headers, body, "token_guard_error")]

    async def _refused(self, refusal: Refusal) -> ProcessingResponse:
        told = encode_headers(await refusal.headers(self.core.quotas))
        headers, body = error_bodies.answer(refusal.error, [*self.tagged, *told, *JSON], refusal.envelope)
        return self._immediate(refusal.error.status, headers, body, "token_guard_route")

    async def _own(self, route: Route) -> ProcessingResponse:
        """The guard's own probes and metrics, answered by the processor rather than by vLLM."""
        if route.path == "/metrics":
            text = self.core.exposition(self.sent)
            return self._immediate(200, [(b"content-type", METRICS_TYPE)], text, "token_guard_metrics")
        if route.path == "/livez":
            return self._immediate(200, JSON, b'{"status":"alive"}', "token_guard_alive")
        status, body = await self.core.readiness(self.core.sight(self.sent)[1])
        return self._immediate(status, JSON, json.dumps(body).encode(), "token_guard_health")

    def _immediate(self, status: int, headers: Headers, body: bytes, details: str) -> ProcessingResponse:
        self.status, self.ended, self.answered_here = status, True, True
        return wire.immediate(status, headers, body, details)


async def _admitted(core: Core, cost: int, excluded: frozenset[int]) -> Ticket:
    """A ticket from the admission gate for `cost` KV tokens, on a replica not `excluded` (429 when refused)."""
    gate = core.upstream.admission
    return gate.try_acquire(cost, excluded) or await gate.acquire(cost, excluded)


def _reading(charge: Charge, status: int, headers: Headers) -> HiddenUsage | None:
    """Readies a keyed request's charge for the answer's body (a stream's output events are counted); the filter that
    takes out the usage event the guard asked for, when the answer is the event stream it asked it of."""
    found = dict(headers)
    if not found.get(b"content-type", b"").startswith(b"text/event-stream"):
        return None
    charge.tail.events = TokenEvents()
    asked = charge.usage_asked and status == 200 and b"content-length" not in found
    return HiddenUsage() if asked else None


def _here() -> None:
    """A client that leaves cancels the stream's task: nothing to ask before counting."""


def _not_own(found: Found) -> InvalidRequest:
    return InvalidRequest(f"The request target is not accepted: behind Envoy only a route's own path is; send "
                          f"{found.path}.", code="invalid_request_target")  # fmt: skip
