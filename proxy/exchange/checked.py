"""A request's count checked against its answer: the usage at the end of a 200 answer (JSON `usage`, a stream's usage
event, Anthropic's message_delta, Responses' response.completed) says what vLLM charged for the prompt; it is kept in
the record (its log line's `usage_prompt_tokens`, the metrics) and a disagreement is evidence (drift/evidence.py)."""

from __future__ import annotations

from proxy.drift.evidence import Evidence, Sighting
from proxy.exchange.record import RequestRecord


def check_count(record: RequestRecord, status: int | None, evidence: Evidence) -> None:
    tail, found = record.tail, record.findings
    if status != 200 or tail is None or not record.checked:
        return
    usage = tail.usage()
    if usage is None or usage[0] is None:
        return  # an answer that says nothing of its prompt (a stream its client asked no usage of)
    charged = record.usage_prompt_tokens = usage[0]
    assert found.expected is not None and found.decision is not None  # record.checked
    source = found.decision.count_source or ""
    if charged == found.expected:
        evidence.agree(found.model or "", source)
    else:
        evidence.weigh(Sighting(found.model or "", source, record.endpoint, record.request_id, found.expected, charged))
