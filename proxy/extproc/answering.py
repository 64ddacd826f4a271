"""The answers of one exchange as Envoy streams it to the processor, and the stream's end. The processor's own answers
(immediate responses: a refusal, count_tokens' count, an error) end the stream at once. An upstream answer's headers
get what every answer of the request carries (exchange/request.py); its body, when Envoy sends it, is read for the
key's charge (the answer's usage, a stream's output events) and for the stored response it creates, with the usage
event the guard asked for taken out; at the stream's end what the request held is given back or handed over, and its
record finished, the same bookkeeping as serve's."""

from __future__ import annotations

import time
from dataclasses import dataclass

from proxy import error_bodies
from proxy.errors import internal_error
from proxy.exchange.headers import Headers
from proxy.exchange.request import Request
from proxy.extproc import wire
from proxy.extproc.wire import FULL_DUPLEX, NONE, HttpHeaders, ProcessingResponse
from proxy.policy.outcome import Answer, Outcome, Refuse
from proxy.policy.usage import Charge, TokenEvents
from proxy.policy.usage_event import HiddenUsage
from proxy.upstream.admission import Ticket

Answers = list[ProcessingResponse]
JSON = [(b"content-type", b"application/json")]


@dataclass(eq=False)
class Answering:
    """What the processor keeps of one exchange's answer."""

    status: int | None = None
    ended: bool = False  # the answer ended: an immediate response, or the response's last byte (or headers)
    hidden: HiddenUsage | None = None  # takes the usage event the guard asked for out of the answer
    sse: bool = False  # the answer is an event stream
    ticket: Ticket | None = None  # the admission's, released (or handed over) at the stream's end
    follows: str | None = None  # a background response's id: its ticket is held past the stream's end
    here: bool = False  # an immediate response was made: Envoy sends nothing more, the stream ends

    def immediate(self, status: int, headers: Headers, body: bytes, details: str) -> ProcessingResponse:
        """An answer the processor makes itself, in place of the upstream's (`details`: Envoy's response code
        details)."""
        self.status, self.ended, self.here = status, True, True
        return wire.immediate(status, headers, body, details)

    def decided(self, request: Request, outcome: Outcome) -> ProcessingResponse:
        """The answer to a request the guard decided not to forward: a refusal, or count_tokens' count."""
        if isinstance(outcome, Answer):
            return self.immediate(200, [*request.headers, *JSON], outcome.body, "token_guard_answered")
        error = outcome.error if isinstance(outcome, Refuse) else internal_error()  # Chunked: never here
        headers, body = error_bodies.answer(error, [*request.headers, *JSON], request.route.envelope)
        return self.immediate(error.status, headers, body, "token_guard_refused")

    def headers(self, request: Request | None, message: HttpHeaders, mode: int, tagged: Headers) -> Answers:
        """The answer's headers (Envoy's response body mode `mode`) get the request's headers, or `tagged` when the
        route table answered for it."""
        self.status = wire.status_of(message.headers)
        if request is not None:
            request.answered(self.status)
            if request.record.charge is not None and mode != NONE:  # the body comes here: read it
                self.hidden = _reading(request.record.charge, self.status, wire.headers_of(message.headers))
        self.ended = message.end_of_stream or mode == NONE  # no body comes: its end is not seen
        if request is not None and request.recorder is not None:  # a stored response's answer: JSON or events
            self.sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in
                           wire.headers_of(message.headers))  # fmt: skip
        return [wire.response_headers(request.headers if request is not None else tagged)]

    async def body(self, request: Request | None, piece: bytes, end: bool, mode: int) -> Answers:
        hidden, out = self.hidden, piece
        recorder = request.recorder if request is not None else None
        if recorder is not None and self.status is not None and recorder.reads(self.status):
            await recorder.read(piece, self.sse)  # recorded before the answer's last bytes go on
            if end:
                await recorder.end(self.sse)
        tail = request.record.tail if request is not None else None
        if tail is not None:
            tail.feed(piece)
        if hidden is not None:
            out = hidden.feed(piece) + (hidden.end() if end else b"")
        if end:
            self.ended = True
            if request is not None:
                request.record.upstream_s = time.perf_counter() - request.record.started
        if mode == FULL_DUPLEX:
            return list(wire.streamed(out, end, response=True))
        return [wire.response_body(None if hidden is None else out)]

    async def close(self, request: Request | None, sent: dict[str, str]) -> None:
        """The stream ended (Envoy closed it, or it was cancelled): the ticket is released, or with a background
        response vLLM took, handed to the followers; the charge settled and the record finished. Without the
        response's headers (a processing mode that skips them) vLLM's acceptance is not known: a refusal is seen at
        the followers' first look."""
        if request is None:
            return
        if self.ticket is not None:
            follows = self.follows if self.status in (None, 200) else None
            replica = request.core.upstream.replica_of(self.ticket) if follows is not None else None
            request.let_go(self.ticket, follows, replica, sent)
        if request.recorder is not None:
            await request.recorder.answered()  # vLLM's 404 from the replica that held it: forgotten
        await request.end(self.status, not self.ended, not self.ended)


def _reading(charge: Charge, status: int, headers: Headers) -> HiddenUsage | None:
    """Readies a keyed request's charge for the answer's body (a stream's output events are counted); the filter that
    takes out the usage event the guard asked for, when the answer is the event stream it asked it of."""
    found = dict(headers)
    if not found.get(b"content-type", b"").startswith(b"text/event-stream"):
        return None
    charge.tail.events = TokenEvents()
    asked = charge.usage_asked and status == 200 and b"content-length" not in found
    return HiddenUsage() if asked else None
