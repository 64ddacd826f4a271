"""Counts that check themselves: every answer whose usage says what vLLM charged for the prompt is compared with the
guard's own count of that request. A vLLM upgraded under a running guard, a server flag the guard cannot see
(`--chat-template`, `--default-chat-template-kwargs`, `--reasoning-effort-map`) or a template fix in a new release all
show up there first.

A disagreement is counted in the metrics (exchange/metrics.py, from the request's record), told in a warning at most
once a minute per model, and, for a model in counting.source "auto" that the guard counts itself, moves its counting
to the upstream where the upstream can count it exactly (the start-up check's rule: drift/source.py) once it is more
than one answer's say: MOVE_AFTER disagreements among the model's last WINDOW checked answers, and at least half of
them. A changed template makes every answer disagree and moves the model within five answers; a client that found
one shape the guard counts differently cannot move a model for everyone with a single request, only by
outnumbering the model's other traffic. The model comes back to local counting when a fresh start-up check agrees
(a replica back from being out is checked again)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.source import CountSource
from proxy.drift.source import upstream_counts
from proxy.upstream.remote_count import RemoteCounter

log = logging.getLogger("token_guard.drift")

QUIET_S = 60.0  # one warning per model in this long; the rest are counted and named in the next
WINDOW = 10  # a model's last checked answers, weighed together
MOVE_AFTER = 3  # disagreements among them that move its counting (when also at least half of them)


@dataclass(frozen=True)
class Sighting:
    """One answer whose usage disagreed with the guard's count."""

    model: str
    source: str  # who counted: local or upstream
    endpoint: str
    request_id: str
    counted: int  # the guard's count of the prompt
    charged: int  # what vLLM's usage says the prompt was

    def says(self) -> str:
        return (f"model {self.model}: vLLM charged {self.charged} prompt tokens where the guard counted {self.counted} "
                f"({self.source}) for a {self.endpoint} request (id {self.request_id})")  # fmt: skip


class Evidence:
    def __init__(
        self, registry: ModelRegistry, counter: RemoteCounter, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry, self.counter, self.clock = registry, counter, clock
        self._warned: dict[str, float] = {}  # model -> when its last warning went out
        self._unsaid: dict[str, int] = {}  # model -> sightings since
        self.moved: dict[str, str] = {}  # model -> why the evidence moved its counting to the upstream
        self._recent: dict[str, deque[bool]] = {}  # served model -> its last checked answers, True where they disagreed

    def agree(self, model: str, source: str) -> None:
        """An answer whose usage agreed with the guard's count."""
        self._record(model, source, False)

    def weigh(self, seen: Sighting) -> None:
        """A disagreement: warned (rate-limited), and in auto a locally counted model moves to upstream counting once
        the disagreements are more than one answer's say (MOVE_AFTER, and half of its last WINDOW)."""
        self._warn(seen)
        recent = self._record(seen.model, seen.source, True)
        if recent is None:
            return  # the upstream counted it: nothing better to move to
        disagreed = sum(recent)
        if disagreed < MOVE_AFTER or 2 * disagreed < len(recent):
            return
        model = self.registry.resolve(seen.model)
        if model.count_source != "auto" or not self._upstream_counts(model):
            return
        reason = f"auto: {seen.says()}; vLLM counts this model's prompts ({self.counter.method})"
        self.registry.set_count_source(seen.model, "upstream", reason)
        self.moved[seen.model] = reason

    def _upstream_counts(self, model: GuardedModel) -> bool:
        """Known to count this model exactly: the start-up check (which shares this counter) found render endpoints,
        or POST /tokenize for a model rendered with a Jinja template. An upstream not known to count (an
        OpenAI-compatible server other than vLLM) never takes the counting: every request would fail over to local."""
        return (self.counter.renders or self.counter.tokenizes) is True and upstream_counts(model, self.counter)

    def _record(self, model: str, source: str, disagreed: bool) -> deque[bool] | None:
        """The model's last WINDOW locally counted answers, this one included (one window per served model, never
        per name a client made up); None for an answer the upstream counted or a name the guard serves nothing by."""
        if source != CountSource.LOCAL or not self.registry.serves(model):
            return None
        recent = self._recent.get(model)
        if recent is None:
            recent = self._recent[model] = deque(maxlen=WINDOW)
        recent.append(disagreed)
        return recent

    def forget(self) -> None:
        """A fresh start-up check decides again (exchange/core.py), on evidence gathered afresh."""
        self.moved.clear()
        self._recent.clear()

    def _warn(self, seen: Sighting) -> None:
        now, last = self.clock(), self._warned.get(seen.model)
        if last is not None and now - last < QUIET_S:
            self._unsaid[seen.model] = self._unsaid.get(seen.model, 0) + 1
            return
        more = self._unsaid.pop(seen.model, 0)
        since = f"; {more} more since the last warning" if more else ""
        log.warning("count mismatch: %s%s", seen.says(), since)
        self._warned[seen.model] = now
