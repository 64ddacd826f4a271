"""The check's look at the Redis that guards share budgets through (admission.redis_url): whether it answers, and
how many guard processes keep a live heartbeat in it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import SharedStateUnavailable
from proxy.settings import AdmissionSettings


@dataclass(frozen=True)
class SharedInfo:
    where: str  # the URL, without its password
    reachable: bool
    instances: int | None  # guard processes (each worker counts) with a live heartbeat

    def line(self) -> str:
        if not self.reachable:
            return f"Redis {self.where}: UNREACHABLE: each guard admits on its own share, or refuses (redis_failure)"
        return f"Redis {self.where}: reachable, shared by {self.instances} guard process(es) with a live heartbeat"


async def shared_info(admission: AdmissionSettings) -> SharedInfo | None:
    if admission.redis_url is None:
        return None
    from proxy.shared.link import RedisLink  # only with a Redis configured
    from proxy.shared.presence import count_instances

    link = RedisLink(admission.redis_url, admission.redis_timeout_ms)
    try:
        return SharedInfo(link.where, True, await count_instances(link))
    except SharedStateUnavailable:
        return SharedInfo(link.where, False, None)
    finally:
        await link.aclose()
