"""The upstream silence deadline: it fires when a wait for the next chunk reaches the timeout, and only then."""

from __future__ import annotations

import asyncio

from proxy.upstream.silence import SilenceWatch


async def fired_within(fired: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(fired.wait(), seconds)
    except TimeoutError:
        return False
    return True


def test_a_wait_that_reaches_the_timeout_fires_once() -> None:
    async def run() -> int:
        calls = 0
        fired = asyncio.Event()

        def silent() -> None:
            nonlocal calls
            calls += 1
            fired.set()

        SilenceWatch(0.05, silent)
        assert await fired_within(fired, 10)
        await asyncio.sleep(0.2)  # not again
        return calls

    assert asyncio.run(run()) == 1


def test_chunks_that_keep_coming_keep_it_quiet_and_stop_ends_it() -> None:
    async def run() -> bool:
        fired = asyncio.Event()
        watch = SilenceWatch(1.0, fired.set)
        for _ in range(30):  # 1.5 s of chunks every 0.05 s: longer than the timeout, no wait as long
            await asyncio.sleep(0.05)
            watch.heard()
            watch.resume()
        assert not fired.is_set()
        watch.stop()
        return await fired_within(fired, 1.5)

    assert asyncio.run(run()) is False


def test_time_with_a_chunk_in_hand_is_not_silence() -> None:
    """Relaying a chunk to a client that reads slowly can take longer than the timeout; the upstream is not silent."""

    async def run() -> tuple[bool, bool]:
        fired = asyncio.Event()
        watch = SilenceWatch(0.05, fired.set)
        watch.heard()
        quiet = not await fired_within(fired, 0.3)  # six timeouts long, with the chunk in hand
        watch.resume()
        return quiet, await fired_within(fired, 10)

    assert asyncio.run(run()) == (True, True)
