"""One record per request: filled in along the request path (the guard's findings, the upstream's timings), then
logged as one line and fed to the metrics."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from proxy.policy.decide import Action
from proxy.policy.outcome import Decision, Findings
from proxy.policy.usage import AnswerTail, Charge

REQUEST_ID = b"x-request-id"
CHECKED = (Action.PASS, Action.CLAMP)  # forwarded with the prompt the guard counted


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    endpoint: str
    guarded: bool
    started: float = field(default_factory=time.perf_counter)
    findings: Findings = field(default_factory=Findings)
    queue_s: float | None = None
    status: int | None = None
    upstream_first_byte_s: float | None = None
    upstream_s: float | None = None
    upstream_error: str | None = None
    client_gone: bool = False
    cancel_s: float | None = None  # from the client's connection closing to its upstream work cancelled
    total_s: float | None = None
    charge: Charge | None = None  # what the request's key was charged, settled when its answer ends
    charged_tokens: int | None = None  # what the key paid in the end
    quota_limited: bool = False  # refused: its key was over quota
    quota_told: bool = False  # its key's x-ratelimit-* headers are in its answer
    merge: str | None = None  # a chunked request's answers merged by "reduce", or "concat" when that would not fit
    evidence: AnswerTail | None = None  # the end of the answer, read for its usage when no charge reads it
    usage_prompt_tokens: int | None = None  # what the answer's usage says vLLM charged for the prompt, when checked

    @property
    def checked(self) -> bool:
        """Whether the answer's usage is compared with the guard's count: the whole prompt counted, forwarded as
        counted (or with its output limit lowered)."""
        decision = self.findings.decision
        return self.findings.expected is not None and decision is not None and decision.action in CHECKED

    @property
    def tail(self) -> AnswerTail | None:
        """The end of the answer as it is relayed: its charge's, or the one read only to check the count."""
        return self.charge.tail if self.charge is not None else self.evidence

    def finish(self, status: int) -> None:
        self.status = status if self.status is None else self.status
        self.total_s = time.perf_counter() - self.started


def request_id(given: str | None) -> str:
    """The client's X-Request-Id when it sent a usable one (vLLM puts it in the response id), else a new one."""
    if given and len(given) <= 256 and given.isprintable():
        return given
    return os.urandom(16).hex()  # 32 hex digits, as a uuid4().hex (and a third of its cost)


def log_fields(record: RequestRecord) -> dict[str, object]:
    found, decision = record.findings, record.findings.decision
    fields: dict[str, object] = {
        "request_id": record.request_id,
        "method": record.method,
        "endpoint": record.endpoint,
        "guarded": record.guarded,
        "model": found.model,
        "key": found.api_key.name if found.api_key else None,
        "prompt_tokens": decision.prompt_tokens if decision else None,
        "action": decision.action if decision else None,
        "max_tokens_before": found.max_tokens_before,
        "max_tokens_after": decision.max_tokens if decision else None,
        "chunks": decision.chunks if decision else None,
        "truncated_tokens": decision.truncated_tokens if decision else None,
        "dropped_messages": decision.dropped_messages if decision else None,
        "count_source": decision.count_source if decision else None,
        "usage_prompt_tokens": record.usage_prompt_tokens,
        "next_turn_tokens": decision.next_turn if decision else None,
        "merge": record.merge,
        "count_s": found.count_s,
        "queue_s": record.queue_s,
        "charged_tokens": record.charged_tokens,
        "quota_limited": record.quota_limited,
        "status": record.status,
        "upstream_first_byte_s": record.upstream_first_byte_s,
        "upstream_s": record.upstream_s,
        "upstream_error": record.upstream_error,
        "client_gone": record.client_gone,
        "cancel_s": record.cancel_s,
        "total_s": record.total_s,
    }
    if decision is not None and (decision.chunk_tokens or decision.thinking is not None):
        fields.update(_rare(decision))
    return {k: _round(v) for k, v in fields.items() if v not in (None, False)}


def _rare(decision: Decision) -> dict[str, object]:
    """The changes few requests get, so that every x-token-guard-* header has its field: the chunks' sizes, and the
    thinking budget lowered (`thinking=lowered thinking_budget=N`) or thinking turned off (`thinking=disabled`)."""
    fields: dict[str, object] = {"chunk_tokens": ",".join(map(str, decision.chunk_tokens)) or None}
    if decision.thinking is not None:
        budget = thinking_budget(decision.thinking)
        fields["thinking"] = "disabled" if budget is None else "lowered"
        fields["thinking_budget"] = budget
    return fields


def thinking_budget(note: str) -> int | None:
    """The budget an x-token-guard-thinking note names (`budget_tokens=N`); None for `disabled`."""
    name, _, value = note.partition("=")
    return int(value) if name == "budget_tokens" and value.isdigit() else None


def log_line(fields: dict[str, object]) -> str:
    """The text format: `name=value` pairs. The values that come from outside the guard (the client's request id and
    path; model and key names) are written as they are when they hold no space, '=', '"' or unprintable character,
    as almost all do: one check of the four at once. Otherwise every such value is written as a JSON string, in
    quotes and escaped, so that a client cannot add fields (`X-Request-Id: abc key=alice status=200`) or lines."""
    get = fields.get
    outside = f"{get('request_id', '')}{get('endpoint', '')}{get('model', '')}{get('key', '')}"
    if _plain(outside):
        return " ".join(f"{k}={v}" for k, v in fields.items())
    return " ".join(f"{k}={_quoted(v)}" for k, v in fields.items())


def _plain(text: str) -> bool:
    return text.isprintable() and " " not in text and "=" not in text and '"' not in text


def _quoted(value: object) -> object:
    return json.dumps(value) if isinstance(value, str) and not _plain(value) else value


def _round(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value
