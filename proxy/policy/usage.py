"""What a keyed request really used, read from the end of its answer as it is relayed: the tokens charged to its
key before it was forwarded (exact input + the output cap reserved) are settled against it afterwards.

    usage in the answer     input + output from it: JSON `usage`, a stream's usage event (stream_options
                            include_usage), Anthropic's message_delta, Responses' response.completed
    a stream without one    the counted input + one token per event relayed (vLLM sends a token per event, a few
                            with speculative decoding: an estimate, close and cheap)
    a chunked request       its chunks' usage summed (policy/merge.py: what its merged answer says), once that
                            answer ended, streamed or not, even if the client left right after its last byte
    its combining request   (chunk_merge = "reduce") not reserved up front: from when it goes out, its cost on top
                            of the chunks' usage, until its own usage replaces that (a client that leaves part way
                            has vLLM abort it, unreported)
    never forwarded         nothing (refused by admission, or the upstream could not be reached)
    an error answer         the counted input
    anything else           the reservation stands (e.g. a chunked answer its client left part way)

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


class AnswerTail:
    """The last bytes of an answer, and how many SSE events went by."""

    __slots__ = ("_pieces", "_size", "events")

    def __init__(self) -> None:
        self._pieces: collections.deque[bytes] = collections.deque()
        self._size = 0
        self.events = 0

    def feed(self, piece: bytes) -> None:
        self.events += piece.count(b"data:")
        self._pieces.append(piece)
        self._size += len(piece)
        while self._size - len(self._pieces[0]) >= TAIL_BYTES:
            self._size -= len(self._pieces.popleft())

    def usage(self) -> tuple[int | None, int] | None:
        """(input, output) tokens from the last usage in the tail; input None when only output is there."""
        tail = b"".join(self._pieces)[-TAIL_BYTES:]
        outputs = OUTPUT.findall(tail)
        if not outputs:
            return None
        inputs = INPUT.findall(tail)
        return (int(inputs[-1]) if inputs else None), int(outputs[-1])


@dataclass(slots=True)
class Charge:
    """The tokens a request's key was charged, and what it learns of what the request used."""

    key: KeySettings
    tokens: int
    prompt_tokens: int
    forwarded: bool = False  # something reached the upstream
    fleet: bool = False  # charged in the fleet's buckets in Redis (else in this process's)
    merged: int | None = None  # a chunked request's input + output from its answers' summed usage (server/chunked.py)
    tail: AnswerTail = field(default_factory=AnswerTail)

    def used(self, status: int | None) -> int:
        if not self.forwarded:
            return 0
        if self.merged is not None:
            return self.merged
        usage = self.tail.usage()
        if usage is not None:
            given, output = usage
            return (self.prompt_tokens if given is None else given) + output
        if self.tail.events:
            return self.prompt_tokens + self.tail.events
        if status is None or status >= 400:
            return self.prompt_tokens
        return self.tokens

    def unused(self, status: int | None) -> int:
        """What goes back to the key (below 0: what the request used beyond its reservation)."""
        return self.tokens - self.used(status)
