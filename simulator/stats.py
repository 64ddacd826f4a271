"""Counters a test reads to see what reached the simulator: how many generation requests came in, how each
ended, how many tokens were generated, the KV load (running cost, its peak, preemptions), and the JSON bodies of the
last 200 (what a proxy actually forwarded).

The server runs in its own thread in tests, so updates and snapshots take a lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Literal

from simulator.kv import KvCache

Outcome = Literal["completed", "aborted", "rejected"]
MAX_BODIES = 200
MAX_ABORTS = 10_000


class SimulatorStats:
    def __init__(self, kv_capacity_tokens: int | None = None) -> None:
        self._lock = threading.Lock()
        self.kv = KvCache(kv_capacity_tokens)
        self.received = 0
        self.completed = 0
        self.aborted = 0
        self.rejected = 0
        self.active = 0
        self.tokens_generated = 0
        self.requests: deque[Any] = deque(maxlen=MAX_BODIES)
        # (x-request-id, time.monotonic()) of each abort: when the client's leaving reached the server
        self.aborts: deque[tuple[str, float]] = deque(maxlen=MAX_ABORTS)

    def start(self, request_id: str | None = None) -> RequestTracker:
        with self._lock:
            self.received += 1
            self.active += 1
        return RequestTracker(self, request_id)

    def record_body(self, body: Any) -> None:
        with self._lock:
            self.requests.append(body)

    def add_tokens(self, count: int) -> None:
        with self._lock:
            self.tokens_generated += count

    def _finish(self, outcome: Outcome, kv_tokens: int, request_id: str | None) -> None:
        self.kv.release(kv_tokens)
        with self._lock:
            self.active -= 1
            setattr(self, outcome, getattr(self, outcome) + 1)
            if outcome == "aborted" and request_id is not None:
                self.aborts.append((request_id, time.monotonic()))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "received": self.received,
                "completed": self.completed,
                "aborted": self.aborted,
                "rejected": self.rejected,
                "active": self.active,
                "tokens_generated": self.tokens_generated,
                "kv_capacity_tokens": self.kv.capacity,
                "running_tokens": self.kv.running,
                "peak_running_tokens": self.kv.peak,
                "preemptions": self.kv.preemptions,
                "requests": list(self.requests),
                "aborts": list(self.aborts),
            }

    def reset(self) -> None:
        """Zero the totals and forget the bodies; requests still in flight stay counted in `active`."""
        with self._lock:
            self.received = self.completed = self.aborted = self.rejected = self.tokens_generated = 0
            self.requests.clear()
            self.aborts.clear()
        self.kv.reset()


class RequestTracker:
    """One request's lifecycle: the first outcome recorded wins, so nothing is counted twice."""

    def __init__(self, stats: SimulatorStats, request_id: str | None = None) -> None:
        self._stats = stats
        self.request_id = request_id
        self.outcome: Outcome | None = None
        self.kv_tokens = 0

    def occupy(self, kv_tokens: int) -> None:
        """The request starts running and holds this many tokens of KV cache until it finishes."""
        self.kv_tokens = kv_tokens
        self._stats.kv.occupy(kv_tokens)

    def generated(self, count: int) -> None:
        self._stats.add_tokens(count)

    def finish(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._stats._finish(outcome, self.kv_tokens, self.request_id)
