"""One guard's fleet admission gate on a real redis-server, with its background work running as the app runs it: two
of them stand for two guards sharing one replica's budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from proxy.fleet.link import RedisLink
from proxy.settings import AdmissionSettings, RedisSettings
from proxy.upstream.admission import Admission, Budget
from proxy.upstream.fleet_gate import FleetAdmission
from tests.support.redis import RedisServer

URL = "http://replica:8000"


@asynccontextmanager
async def gate(redis: RedisServer, tokens: int = 100, share: int = 50, running: bool = True,
               **settings: Any) -> AsyncIterator[FleetAdmission]:  # fmt: skip
    """One guard's gate on a replica whose whole budget is `tokens` (`share` of it its own, for when Redis is away);
    `running`: its background work runs, as the app runs it (when not: a guard that stopped renewing). Without
    credit unless asked (block_share): every request takes the round trip, so each test sees what it looks at.
    `settings`: RedisSettings' fields (lease_s, failure, block_share) and AdmissionSettings' (queue_timeout_s)."""
    options = {"lease_s": 30.0, "block_share": 0.0, **settings}
    queue_timeout_s = options.pop("queue_timeout_s", 5.0)
    admission = AdmissionSettings(max_inflight_tokens=tokens, queue_timeout_s=queue_timeout_s)
    fleet = RedisSettings(url=redis.url, **options)
    link = RedisLink(redis.url, 2000)  # generous: a late answer on a loaded machine is the link tests' business
    local = Admission([Budget(share)], admission.queue_timeout_s, admission.max_queue)
    shared = FleetAdmission(local, [URL], [Budget(tokens)], link, admission, fleet)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(shared.run()), group.create_task(link.watch())] if running else []
        try:
            yield shared
        finally:
            for task in tasks:
                task.cancel()
    await link.aclose()
