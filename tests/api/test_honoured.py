"""The headers vLLM acts on besides the body, as a guarded request takes them upstream: the adapter header pinned to
the one value the guard read (on /invocations), the data-parallel rank taken off."""

from __future__ import annotations

from proxy.api.honoured import ADAPTER, DP_RANK, for_upstream, header_changes


def test_the_adapter_header_is_pinned_on_invocations_only() -> None:
    headers = {ADAPTER: "other", "content-type": "application/json"}
    assert header_changes("invocations", headers) == ({ADAPTER: "other"}, ())
    assert header_changes("chat", headers) == ({}, ())  # vLLM reads it on /invocations alone
    assert header_changes("invocations", {"content-type": "application/json"}) == ({}, ())


def test_the_data_parallel_rank_is_taken_off_every_guarded_route() -> None:
    headers = {DP_RANK: "1", "x-request-id": "r"}
    assert header_changes("completion", headers) == ({}, (DP_RANK,))
    assert for_upstream("embeddings", headers) == {"x-request-id": "r"}
    assert for_upstream("invocations", {**headers, ADAPTER: "a"}) == {"x-request-id": "r", ADAPTER: "a"}
