"""The admission gate on its own: budgets, FIFO order, the oversized-alone rule, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import random

import pytest

from proxy.errors import TooBusy
from proxy.upstream.admission import Admission, Budget, kv_capacity
from simulator.cache_info import LABELS_031, LABELS_032, LABELS_033, LABELS_034, Labels, cache_config_info


def gate(tokens: int = 100, requests: int = 0, replicas: int = 1, timeout: float = 5.0, queue: int = 100) -> Admission:
    return Admission([Budget(tokens, requests) for _ in range(replicas)], timeout, queue)


def test_admits_within_budget_and_releases_once() -> None:
    async def run() -> None:
        admission = gate(100)
        a = await admission.acquire(60)
        b = await admission.acquire(40)
        assert admission.budgets[0].tokens == 100
        admission.release(a)
        admission.release(a)  # a second release frees nothing more
        assert admission.budgets[0].tokens == 40 and admission.budgets[0].requests == 1
        admission.release(b)
        assert admission.budgets[0].tokens == 0 and admission.budgets[0].requests == 0

    asyncio.run(run())


def test_over_budget_waits_in_fifo_order() -> None:
    async def run() -> list[str]:
        admission = gate(100)
        first = await admission.acquire(100)
        order: list[str] = []

        async def want(name: str, cost: int) -> None:
            ticket = await admission.acquire(cost)
            order.append(name)
            await asyncio.sleep(0)
            admission.release(ticket)

        tasks = [asyncio.ensure_future(want(n, c)) for n, c in (("big", 90), ("small", 5), ("tiny", 1))]
        await asyncio.sleep(0.01)
        assert admission.queued == 3 and order == []  # small and tiny do not overtake big
        admission.release(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["big", "small", "tiny"]


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    async def run() -> None:
        admission = gate(100)
        small = await admission.acquire(10)
        huge = asyncio.ensure_future(admission.acquire(500))
        await asyncio.sleep(0.01)
        assert not huge.done()
        admission.release(small)
        ticket = await asyncio.wait_for(huge, 1)
        assert admission.budgets[0].tokens == 500
        admission.release(ticket)

    asyncio.run(run())


def test_queue_timeout_and_full_queue_give_429_with_retry_after() -> None:
    async def run() -> None:
        admission = gate(100, timeout=0.05, queue=1)
        held = await admission.acquire(100)
        with pytest.raises(TooBusy) as timed_out:
            await admission.acquire(10)
        assert timed_out.value.status == 429 and timed_out.value.code == "rate_limit_exceeded"
        assert timed_out.value.retry_after_s >= 1
        waiting = asyncio.ensure_future(admission.acquire(10))
        await asyncio.sleep(0.01)
        with pytest.raises(TooBusy, match="queue is full"):
            await admission.acquire(10)
        admission.release(held)
        admission.release(await waiting)
        assert admission.budgets[0].tokens == 0 and admission.queued == 0

    asyncio.run(run())


def test_cancelled_while_queued_leaves_nothing_behind() -> None:
    async def run() -> None:
        admission = gate(100)
        held = await admission.acquire(100)
        waiting = asyncio.ensure_future(admission.acquire(50))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert admission.queued == 0
        admission.release(held)
        assert admission.budgets[0].tokens == 0 and admission.budgets[0].requests == 0

    asyncio.run(run())


def test_request_budget_and_least_loaded_replica() -> None:
    async def run() -> None:
        admission = gate(0, requests=1, replicas=2)
        a = await admission.acquire(10)
        b = await admission.acquire(10)
        assert {a.replica, b.replica} == {0, 1}
        third = asyncio.ensure_future(admission.acquire(10))
        await asyncio.sleep(0.01)
        assert not third.done()
        admission.release(b)
        assert (await asyncio.wait_for(third, 1)).replica == b.replica

    asyncio.run(run())


def test_unavailable_replica_is_skipped() -> None:
    async def run() -> None:
        admission = gate(100, replicas=2)
        admission.budgets[0].available = False
        assert (await admission.acquire(10)).replica == 1

    asyncio.run(run())


def test_kv_capacity_from_vllm_metrics() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048",num_cpu_blocks="0"} 1.0\n'
    )
    assert kv_capacity(text) == 32768
    assert kv_capacity("vllm:num_requests_running 0.0\n") is None


@pytest.mark.parametrize(
    "labels", [LABELS_031, LABELS_032, LABELS_033, LABELS_034], ids=["0.31", "0.32", "0.33", "0.34"]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_capacity_from_each_releases_label_set_in_any_order(labels: Labels, seed: int) -> None:
    """0.34's gauge carries 40 labels (gpu_memory_utilization="None", enable_extensible_kv_cache, engine, ...), the
    block counts among them; the parser finds num_gpu_blocks and block_size wherever they stand."""
    shuffled = list(labels)
    random.Random(seed).shuffle(shuffled)
    text = cache_config_info(tuple(shuffled), 12_288)
    assert text.index('num_gpu_blocks="768"') > 0 and text.index('block_size="16"') > 0
    assert kv_capacity("vllm:num_requests_running 0.0\n" + text) == 12_288
