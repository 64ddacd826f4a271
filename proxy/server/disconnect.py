"""Work that stops when the client goes away: cancelling it closes its upstream connections, which is what makes
vLLM abort the generation and free its KV cache."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from proxy.errors import first_error

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone."""
    try:
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(_raise_when_gone(receive))
            try:
                return await work
            finally:
                watcher.cancel()
    except BaseExceptionGroup as errors:  # the work's own failure, or ClientGone from the watcher
        raise first_error(errors) from None


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _raise_when_gone(receive: Receive) -> None:
    await wait_for_disconnect(receive)
    raise ClientGone()
