"""`token-guard doctor`, a doctor for drift: count sample requests with the guard's own renderer and tokenizer, with
the upstream's `POST /tokenize` and by what the upstream charges for them, and report every disagreement, each model's
rendering path and count source and why, the context window each side believes and the upstream's version.
The start-up check (proxy/drift/startup.py) runs the same comparison once when a front end starts, and there decides
counting.source auto.

A tokenizer or template that drifted (a vLLM upgrade, a model re-uploaded with a fixed template) makes every clamp
and overflow decision wrong by the size of the difference, silently; this is how it becomes visible.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy.api.models import ModelCard
from proxy.counting.isolated import IsolatedRenderer
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.doctor.fleet import fleet_info
from proxy.doctor.report import ModelInfo, Report
from proxy.drift.compare import Window
from proxy.drift.defaults import learn
from proxy.drift.samples import BUILTIN_SAMPLES, Sample, SamplesError, load_samples
from proxy.drift.sides import count_both
from proxy.drift.source import apply
from proxy.drift.startup import upstream_version
from proxy.errors import GuardError
from proxy.settings import Settings
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import RemoteCounter


class CheckError(Exception):
    """The check could not run at all (exit 2): the upstream is unreachable, or there is no model to check."""


async def check(settings: Settings, samples: Sequence[Sample], wait_s: float) -> Report:
    registry = ModelRegistry.from_settings(settings.models, settings.counting)
    sandbox = IsolatedRenderer()  # a sample's own chat template renders in it, as a request's does when serving
    registry.render_requests_in(sandbox)
    upstream = Upstream(settings.upstream, HttpClient(settings.upstream))
    try:
        cards = await _discover(upstream, wait_s, settings.upstream.connect_timeout_s)
        registry.apply_discovery(cards)
        if not registry.names:
            raise CheckError(
                "no model to check: configure one (--model and --tokenizer), or share the model volume so the roots "
                f"the upstream reports ({_roots(cards)}) are readable here"
            )
        version, version_error = await upstream_version(upstream)
        if version is not None:
            registry.set_upstream_version(version)
        await learn(registry, upstream)
        models = [registry.resolve(name) for name in registry.names]
        rows = [row for model in models for row in await count_both(model, samples, upstream)]
        await apply(registry, rows, RemoteCounter(upstream))
        windows = [_window(model, cards) for model in models]
        infos = [ModelInfo.of(registry.resolve(name)) for name in registry.names]
    except GuardError as exc:
        raise CheckError(exc.message) from None
    finally:
        await upstream.aclose()
        await asyncio.to_thread(sandbox.close)
    return Report(upstream.where, version, version_error, rows, windows, infos, await fleet_info(settings.redis))


async def _discover(upstream: Upstream, wait_s: float, connect_timeout_s: float) -> list[ModelCard]:
    try:
        async with asyncio.timeout(wait_s + connect_timeout_s):  # one slow attempt must not outlast --wait
            return await discover(upstream, wait_s, retry_s=1.0)
    except (GuardError, TimeoutError) as exc:
        last = exc.__cause__ if isinstance(exc.__cause__, GuardError | ValueError) else exc
        reason = last.message if isinstance(last, GuardError) else str(last) or "no answer to GET /v1/models"
        raise CheckError(f"cannot reach the upstream at {upstream.where} within {wait_s:g} s: {reason}") from None


def _window(model: GuardedModel, cards: list[ModelCard]) -> Window:
    card = next((c for c in cards if c.id == model.name), None)
    return Window(model.name, model.max_model_len, model.length_source, card.max_model_len if card else None)


def _roots(cards: list[ModelCard]) -> str:
    return ", ".join(f"{c.id}: {c.root}" for c in cards) or "it lists no models"


def run_doctor(settings: Settings, samples_file: Path | None, wait_s: float, as_json: bool) -> int:
    """Exit status: 0 all agree, 1 a count or window mismatch, 2 the check could not run."""
    logging.basicConfig(level=settings.server.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /tokenize call says nothing the table does not
    try:
        samples = [*BUILTIN_SAMPLES, *(load_samples(samples_file) if samples_file else [])]
        report = asyncio.run(check(settings, samples, wait_s))
    except (CheckError, SamplesError) as exc:
        print(f"token-guard doctor: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2) if as_json else report.table())
    return 1 if report.failed else 0
