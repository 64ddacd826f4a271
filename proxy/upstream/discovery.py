"""Learn what the upstream serves from `GET /v1/models`: each model's id, max_model_len, root and parent.

At start-up the upstream may still be loading its weights, so `discover()` waits and retries with a log line
each time instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from proxy.api.models import ModelCard, parse_models
from proxy.errors import GuardError
from proxy.upstream.client import Upstream

log = logging.getLogger("token_guard.discovery")


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
                     upstream.where, message, retry_s, waited, wait_s)  # fmt: skip
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 1.5, 10.0)
