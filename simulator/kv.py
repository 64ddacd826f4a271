"""The fake engine's KV cache: the running cost (prompt tokens + max_tokens of every active sequence), its peak, and,
with a capacity, the slowdown a real vLLM shows when that cost no longer fits and it preempts or swaps.

Over capacity every running sequence's delays are multiplied by running_cost / capacity: deterministic, and the more
the cache is oversubscribed the slower everything gets, which is the shape of vLLM's recompute/swap stalls.
"""

from __future__ import annotations

import threading


class KvCache:
    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()  # the simulator runs in a thread of its own in tests; readers snapshot
        self.running = 0
        self.peak = 0
        self.preemptions = 0  # how many times the running cost went from within capacity to over it

    def occupy(self, cost: int) -> None:
        with self._lock:
            was_over = self._over()
            self.running += cost
            self.peak = max(self.peak, self.running)
            if self._over() and not was_over:
                self.preemptions += 1

    def release(self, cost: int) -> None:
        with self._lock:
            self.running -= cost

    def slowdown(self) -> float:
        """The factor every running sequence's delays are multiplied by now (1 while the cost fits)."""
        with self._lock:
            return self.running / self.capacity if self.capacity and self._over() else 1.0

    def reset(self) -> None:
        """Forget the peak and the preemptions; the cost of sequences still running stays."""
        with self._lock:
            self.peak = self.running
            self.preemptions = 0

    def _over(self) -> bool:
        return self.capacity is not None and self.running > self.capacity
