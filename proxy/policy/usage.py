"""What a keyed request really used, read from the end of its answer as it is relayed: the tokens charged to its
key before it was forwarded (exact input + the output cap reserved) are settled against it afterwards.

    never handed upstream   nothing: it waited in admission's queue and its client left, admission refused it, or
                            no replica could be reached (connection refused or timed out)
    usage in the answer     input + output from it: JSON `usage`, a stream's usage event (asked for by the client,
                            or by the guard for it: policy/usage_event.py), Anthropic's message_delta, Responses'
                            response.completed
    a chunked request       its chunks' usage summed (policy/merge.py: what its merged answer says), once that
                            answer ended, streamed or not, even if the client left right after its last byte
    its combining request   (chunk_merge = "reduce") not reserved up front: from when it goes out, its cost on top
                            of the chunks' usage, until its own usage replaces that
    its client left first   the reservation: vLLM aborts a request only at its next step after the connection
                            closed, says nothing of what it generated, and a non-streamed answer shows nothing before
                            its end; the reservation is the one figure never below what ran (vLLM generates at most
                            the clamped output cap), and what admission held for it meanwhile
    an error answer         the counted input
    a stream without usage  the counted input + the events that carry output (`TokenEvents`): a lower bound of what
                            vLLM generated, as each such event carries at least one token (more with speculative
                            decoding or a stream interval; a parser's held-back tokens send none)
    anything else           the reservation stands (an answer that says nothing of what it used)

Only the end of the answer is kept (usage comes last in every shape vLLM writes), so this costs a bounded copy."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

from proxy.settings.sections import KeySettings

TAIL_BYTES = 16384
# A key is a JSON string right before a colon; inside a string a quote is escaped, so text cannot match.
INPUT = re.compile(rb'"(?:prompt_tokens|input_tokens)":\s*(\d+)')
OUTPUT = re.compile(rb'"(?:completion_tokens|output_tokens)":\s*(\d+)')
# Anthropic's input_tokens leave out the prompt's cached part (vLLM with --enable-prompt-tokens-details): added back
CACHED = re.compile(rb'"cache_(?:read|creation)_input_tokens":\s*(\d+)')
EVENT_BYTES = 2**20  # an event longer than this is not looked into (it is not counted: the count stays a floor)
DIGITS = b"0123456789"


class TokenEvents:
    """The events of a stream that carry generated output, counted as they go by: whole events only, at most one
    each, so that a piece boundary never counts one twice or counts a role event."""

    __slots__ = ("_pending", "count")

    def __init__(self) -> None:
        self._pending = b""
        self.count = 0

    def feed(self, piece: bytes) -> None:
        if not self._pending and piece.endswith(b"\n\n") and piece.find(b"\n\n") == len(piece) - 2:  # one event
            self.count += carries_output(piece)
            return
        data = self._pending + piece
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data if len(data) <= EVENT_BYTES else b""
            return
        self._pending = data[end + 2 :] if len(data) - end - 2 <= EVENT_BYTES else b""
        self.count += sum(map(carries_output, data[:end].split(b"\n\n")))


def carries_output(event: bytes) -> bool:
    """Whether an event carries generated output, in each shape vLLM streams: a chat (or transcription, or Anthropic
    content_block_delta) delta that is not the role event's (nor Anthropic's message_delta), a Responses delta event,
    a completion chunk's choice, a token-in chunk's token ids. A key is a JSON string right before a colon; inside a
    string a quote is escaped, so text cannot pass for one."""
    at = event.find(b'"delta":')
    if at >= 0:
        return not event.startswith((b'{"role"', b'{"stop_reason"'), at + 8)
    if b'"object":"text_completion"' in event:
        return b'"choices":[{' in event
    at = event.find(b'"token_ids":[')
    return at >= 0 and at + 13 < len(event) and event[at + 13] in DIGITS


class AnswerTail:
    """The last bytes of an answer, and, for a stream, the events that carried output."""

    __slots__ = ("_pieces", "_size", "events")

    def __init__(self) -> None:
        self._pieces: collections.deque[bytes] = collections.deque()
        self._size = 0
        self.events: TokenEvents | None = None  # set by the front end when the answer is an event stream

    def feed(self, piece: bytes) -> None:
        if self.events is not None:
            self.events.feed(piece)
        self._pieces.append(piece)
        self._size += len(piece)
        while self._size - len(self._pieces[0]) >= TAIL_BYTES:
            self._size -= len(self._pieces.popleft())

    def usage(self) -> tuple[int | None, int] | None:
        """(input, output) tokens from the last usage in the tail; input None when only output is there. The input
        is the whole prompt: Anthropic's cache_read/cache_creation_input_tokens of the same usage added back."""
        tail = b"".join(self._pieces)[-TAIL_BYTES:]
        outputs = OUTPUT.findall(tail)
        if not outputs:
            return None
        last = collections.deque(INPUT.finditer(tail), maxlen=1)
        if not last:
            return None, int(outputs[-1])
        found = last[0]
        end = tail.find(b"}", found.end())  # Anthropic's usage is flat: its cache fields come before its end
        cached = sum(map(int, CACHED.findall(tail, found.end(), end if end >= 0 else len(tail))))
        return int(found.group(1)) + cached, int(outputs[-1])


@dataclass(slots=True)
class Charge:
    """The tokens a request's key was charged, and what it learns of what the request used."""

    key: KeySettings
    tokens: int
    prompt_tokens: int
    fleet: bool = False  # charged in the fleet's buckets in Redis (else in this process's)
    usage_asked: bool = False  # the guard asked vLLM for the stream's usage event, which its client did not
    handed: int = 0  # requests handed to the upstream for it, less those no replica could be reached for
    merged: int | None = None  # a chunked request's input + output from its answers' summed usage (server/chunked.py)
    tail: AnswerTail = field(default_factory=AnswerTail)

    @property
    def forwarded(self) -> bool:
        """Something was handed to the upstream: from then on the key pays at least the input."""
        return self.handed > 0

    def hand(self, sent: bool) -> None:
        """A request for it goes to the upstream (`sent`), or one that went could not reach any replica."""
        self.handed += 1 if sent else -1

    def used(self, status: int | None, gone: bool = False) -> int:
        """What the request used, once its answer ended with `status` (None: none began); `gone`: its client left
        before the answer's end."""
        if not self.forwarded:
            return 0
        if self.merged is not None:
            return self.merged
        usage = self.tail.usage()
        if usage is not None:
            given, output = usage
            return (self.prompt_tokens if given is None else given) + output
        if gone or status is None:
            return self.tokens
        if status >= 400:
            return self.prompt_tokens
        if self.tail.events is not None:
            return min(self.tokens, self.prompt_tokens + self.tail.events.count)
        return self.tokens

    def unused(self, status: int | None, gone: bool = False) -> int:
        """What goes back to the key (below 0: what the request used beyond its reservation)."""
        return self.tokens - self.used(status, gone)
