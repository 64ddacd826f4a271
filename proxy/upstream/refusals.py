"""vLLM's answers that say "not now, not here": the request was not run, and another replica (or this one, a little
later) could run it. Each is told by its message, read from vLLM's source, in one table; the upstream client
(client.py) tries another replica for any of them, and when none is left answers the client with a retryable error.

    marker                                                     code             first release
    The engine is currently busy and cannot accept ...         queue_full       0.31 (--max-num-queued-reqs)
    The engine has reached its prefill token backlog limit.    queue_full       0.31 (--max-num-queued-tokens)
    The model is currently scaling. Please try again later.    scaling          0.31 (elastic EP, scaling)
    Generation is paused. Please retry after it resumes.       engine_paused    0.33 (POST /pause, abort or wait)
    This data-parallel rank has been retired and is ...        rank_retired     0.33 (elastic EP, scaled in)
    The engine has faulted and cannot accept new requests.     engine_faulted   0.34 (fault tolerance)

Each is a 503 (the elastic-EP ones a bare `{"error": "..."}` from a middleware, while /health stays 200); a stream
that met one after its 200 went out starts with it as its first event (OpenAI's `data: {"error"` on chat and
completions, Anthropic's `event: error` on /v1/messages).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.error_bodies import ERROR_EVENT_STARTS
from proxy.errors import GuardError, GuardUnavailable, TooBusy
from proxy.upstream.transport import Answer

# how long a client is told to wait when a replica is paused, faulted or leaving: vLLM says no more than "retry";
# the openai and anthropic SDKs wait what Retry-After says (up to 60 s), then retry a 503 as they retry a 429
UNAVAILABLE_RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Refusal:
    marker: bytes  # a piece of vLLM's message that no other answer carries
    code: str  # the code of the guard's answer when no replica could take the request
    since: str  # the first vLLM release that sends it

    @property
    def busy(self) -> bool:
        """vLLM's own queue is full: the guard answers as its own admission does (429 rate_limit_exceeded)."""
        return self.code == "queue_full"

    def error(self, retry_after_s: int) -> GuardError:
        """The answer when every replica tried refused. A full queue is a 429, as the guard's own admission answers;
        a paused, faulted or leaving replica is not a client over a rate, so a 503 in the guard's envelope, as the
        guard's own unavailability (GuardUnavailable): both with Retry-After, both retried by the openai SDK."""
        said = self.marker.decode()
        if self.busy:
            return TooBusy(f"The upstream is at its request queue limit: {said}", retry_after_s)
        return GuardUnavailable(f"No upstream replica can take the request now: {said}", UNAVAILABLE_RETRY_AFTER_S,
                                self.code)  # fmt: skip


REFUSALS = (
    Refusal(b"The engine is currently busy and cannot accept new requests.", "queue_full", "0.31"),
    Refusal(b"The engine has reached its prefill token backlog limit.", "queue_full", "0.31"),
    Refusal(b"The model is currently scaling. Please try again later.", "scaling", "0.31"),
    Refusal(b"Generation is paused. Please retry after it resumes.", "engine_paused", "0.33"),
    Refusal(b"This data-parallel rank has been retired and is awaiting shutdown.", "rank_retired", "0.33"),
    Refusal(b"The engine has faulted and cannot accept new requests.", "engine_faulted", "0.34"),
)


async def refusal(response: Answer) -> Refusal | None:
    """Which of REFUSALS an answer is: a 503, or a 200 stream whose first event is the error. None for any other
    answer; the first piece read to tell stays in the answer."""
    if response.status == 503 or (response.status == 200 and response.is_sse):
        head = await response.first()
        if response.is_sse and not head.startswith(ERROR_EVENT_STARTS):
            return None
        for known in REFUSALS:
            if known.marker in head:
                return known
    return None
