"""The start-up check: once the upstream's models are known, the built-in samples counted on both sides for every
guarded model, which decides counting.source auto per model; its disagreements are warnings, never a reason not to
serve. `token-guard doctor` (proxy/doctor/) runs the same comparison on demand and reports it."""

from __future__ import annotations

from proxy.counting.registry import ModelRegistry
from proxy.drift.compare import drift_lines
from proxy.drift.defaults import learn
from proxy.drift.samples import BUILTIN_SAMPLES
from proxy.drift.sides import count_both
from proxy.drift.source import apply
from proxy.errors import GuardError
from proxy.upstream.client import Upstream
from proxy.upstream.remote_count import RemoteCounter


async def drift_warnings(
    registry: ModelRegistry, upstream: Upstream, counter: RemoteCounter | None = None
) -> list[str]:
    """The built-in samples for every guarded model, as warning lines (none when all agree); in counting.source
    auto, a model that disagrees is counted by the upstream from then on. `counter`: the one that learns whether the
    upstream can count (its render endpoints, POST /tokenize), kept for the answers' evidence (drift/evidence.py).
    Never raises: start-up goes on whatever happens, and a check that could not run is itself a warning line."""
    try:
        version, _ = await upstream_version(upstream)
        if version is not None:
            registry.set_upstream_version(version)
        await learn(registry, upstream)
        rows = []
        for name in registry.names:
            model = registry.resolve(name)
            rows += await count_both(model, BUILTIN_SAMPLES, upstream)
        await apply(registry, rows, counter or RemoteCounter(upstream))
    except GuardError as exc:
        return [f"drift check against {upstream.where} could not run: {exc.message}"]
    except Exception as exc:  # a warning must never stop the proxy from serving
        return [f"drift check against {upstream.where} failed unexpectedly: {exc!r}"]
    finally:
        registry.checked = True
    return drift_lines(rows)


async def upstream_version(upstream: Upstream) -> tuple[str | None, str | None]:
    """vLLM's version from its GET /version, or None and why not."""
    try:
        payload = await upstream.get_json("/version", timeout_s=5.0)
    except GuardError as exc:
        return None, exc.message
    version = payload.get("version") if isinstance(payload, dict) else None
    return (version, None) if isinstance(version, str) else (None, "GET /version has no 'version'")
