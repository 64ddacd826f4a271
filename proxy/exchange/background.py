"""Background responses followed until they end: vLLM answers a `background: true` request on /v1/responses with the
response `queued` and runs it after that answer, so its admission ticket (and a limited key's reservation) is held
past the answer, while the guard polls the stored response on the replica that runs it (`GET /v1/responses/{id}`
every admission.background_poll_s). Once vLLM says it ended (completed, incomplete, failed, cancelled; or it forgot it,
a 404), or admission.background_max_s has passed, the ticket is released and the key's charge settled from the
response's usage. The followers are background work of the front end's lifetime (exchange/core.py's jobs): at a stop
each ends, gives back what it holds, and the drain's line counts it."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from dataclasses import dataclass, field

from proxy.errors import GuardError, UpstreamTooLarge
from proxy.exchange.drain import Drain
from proxy.exchange.metering import Meter
from proxy.exchange.metrics import Metrics
from proxy.exchange.record import RequestRecord
from proxy.policy.usage import AnswerTail, Charge
from proxy.settings import AdmissionSettings
from proxy.upstream.admission import Ticket
from proxy.upstream.client import Upstream

log = logging.getLogger("token_guard.background")

ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
LOOK_BYTES = 16 * 2**20  # a finished response is read whole once; one larger is taken as ended, its usage unread
LOOK_TIMEOUT_S = 10.0
UNFOLLOWED = "background responses no longer followed"


@dataclass(eq=False)
class Followed:
    """A background response the guard holds a ticket for, until vLLM says it ended."""

    response_id: str
    replica: str  # the URL of the replica that runs it
    credentials: dict[str, str]  # what its create sent upstream: the guard's polls send the same
    ticket: Ticket | None
    charge: Charge | None
    record: RequestRecord
    started: float = field(default_factory=time.monotonic)


class Followers:
    def __init__(
        self, upstream: Upstream, meter: Meter, drain: Drain, admission: AdmissionSettings, metrics: Metrics
    ) -> None:
        self.upstream, self.meter, self.drain, self.metrics = upstream, meter, drain, metrics
        self.poll_s, self.max_s = admission.background_poll_s, admission.background_max_s
        self.following: set[Followed] = set()
        self._waiting: collections.deque[Followed] = collections.deque()
        self._arrived = asyncio.Event()

    def follow(self, followed: Followed) -> None:
        """Hold `followed`'s ticket and charge until its response ends (run() follows it)."""
        self.following.add(followed)
        self._waiting.append(followed)
        self._arrived.set()

    async def run(self) -> None:
        """Follow each response handed over, each in a task of one group; cancelled (the front end stops), every
        follower ends and gives back what it holds."""
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    await self._arrived.wait()
                    self._arrived.clear()
                    while self._waiting:
                        group.create_task(self._follow(self._waiting.popleft()))
        finally:
            while self._waiting:  # handed over as the front end stopped: never polled
                await self._end(self._waiting.popleft(), None, b"")

    async def _follow(self, followed: Followed) -> None:
        state, raw = None, b""
        try:
            state, raw = await self._until_ended(followed)
        except asyncio.CancelledError:
            self.drain.was_cut(UNFOLLOWED)
            raise
        except Exception:
            log.exception("following background response %s failed; its ticket is given back", followed.response_id)
        finally:
            await self._end(followed, state, raw)

    async def _until_ended(self, followed: Followed) -> tuple[str | None, bytes]:
        """The state vLLM ended the response in and its stored body; None: not known (its replica forgot it, its
        body is too large to read, or admission.background_max_s passed)."""
        path = f"/v1/responses/{followed.response_id}"
        while time.monotonic() - followed.started < self.max_s:
            await asyncio.sleep(self.poll_s)
            try:
                status, raw = await self.upstream.look(followed.replica, path, followed.credentials, LOOK_TIMEOUT_S,
                                                       LOOK_BYTES)  # fmt: skip
            except UpstreamTooLarge:
                return None, b""
            except GuardError as exc:
                log.info("background response %s: its replica did not answer (%s); asking again", followed.response_id,
                         exc.message)  # fmt: skip
                continue
            if status == 404 and not await self._found_elsewhere(followed, path):
                log.warning("background response %s: no replica knows it; its ticket is given back",
                            followed.response_id)  # fmt: skip
                return None, b""
            state = _state(raw) if status == 200 else None
            if state in ENDED:
                return state, raw
        log.warning("background response %s still running after admission.background_max_s (%g s): no longer "
                    "followed, its ticket given back", followed.response_id, self.max_s)  # fmt: skip
        return None, b""

    async def _found_elsewhere(self, followed: Followed, path: str) -> bool:
        """Whether another replica stores the response (then followed there): behind Envoy without a picker, the
        replica admission charged need not be the one Envoy sent the request to."""
        for replica in self.upstream.urls:
            if replica == followed.replica:
                continue
            try:
                status, _ = await self.upstream.look(replica, path, followed.credentials, LOOK_TIMEOUT_S, LOOK_BYTES)
            except GuardError:
                continue
            if status == 200:
                followed.replica = replica
                return True
        return False

    async def _end(self, followed: Followed, state: str | None, raw: bytes) -> None:
        """Give back the ticket, and settle the key's charge: the usage of a response that ended with one; the input
        of one that failed; the reservation of any other (cancelled, or not known: vLLM says nothing of what ran)."""
        self.following.discard(followed)
        self.upstream.release(followed.ticket)
        charge = followed.charge
        if charge is not None:
            charge.tail = AnswerTail()
            charge.tail.feed(raw)
            status = 500 if state == "failed" else 200
            await self.meter.settle(charge, followed.record, status, gone=state in (None, "cancelled"))
            self.metrics.charged(followed.record)
        log.info("background response %s ended %s after %.1f s; %d KV tokens given back%s", followed.response_id,
                 state or "unseen", time.monotonic() - followed.started,
                 followed.ticket.cost if followed.ticket else 0,
                 "" if charge is None else f", key charged {followed.record.charged_tokens}")  # fmt: skip

    @property
    def count(self) -> int:
        return len(self.following)


def _state(raw: bytes) -> str | None:
    """The `status` of a stored response, as vLLM answers GET /v1/responses/{id}."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    state = body.get("status") if isinstance(body, dict) else None
    return state if isinstance(state, str) else None
