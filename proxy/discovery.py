"""Learn what the upstream serves from `GET /v1/models`: each model's id, max_model_len, root and parent.

At start-up the upstream may still be loading its weights, so `discover()` waits and retries with a log line
each time instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from proxy.errors import GuardError
from proxy.upstream import Upstream

log = logging.getLogger("token_guard.discovery")


@dataclass(frozen=True)
class ModelCard:
    id: str
    max_model_len: int | None
    root: str | None
    parent: str | None


def parse_models(payload: object) -> list[ModelCard]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("GET /v1/models did not answer an object with a 'data' list")
    cards = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            length = item.get("max_model_len")
            cards.append(
                ModelCard(
                    id=item["id"],
                    max_model_len=length if isinstance(length, int) and not isinstance(length, bool) else None,
                    root=item.get("root") if isinstance(item.get("root"), str) else None,
                    parent=item.get("parent") if isinstance(item.get("parent"), str) else None,
                )
            )
    return cards


async def discover(upstream: Upstream, wait_s: float, retry_s: float = 2.0) -> list[ModelCard]:
    """Ask the upstream for its models, retrying until `wait_s` has passed; raises GuardError after that."""
    started = time.monotonic()
    while True:
        try:
            return parse_models(await upstream.get_json("/v1/models", timeout_s=10.0))
        except (GuardError, ValueError) as exc:
            waited = time.monotonic() - started
            if waited + retry_s > wait_s:
                raise GuardError(f"gave up waiting for the upstream after {waited:.0f} s: {exc}") from exc
            message = exc.message if isinstance(exc, GuardError) else str(exc)
            log.info("upstream %s not ready (%s); retrying in %.0f s (waited %.0f of %.0f s)",
                     upstream.url, message, retry_s, waited, wait_s)  # fmt: skip
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 1.5, 10.0)
