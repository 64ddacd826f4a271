"""counting.source "auto", decided per model from the check's rows: count locally where the guard agreed with what
vLLM charges on every sample, else let the upstream count this model's prompts, when it can count them exactly
(its render endpoints; or POST /tokenize, which is exact only for models rendered with a Jinja template)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.drift.compare import MISMATCH, Row
from proxy.errors import GuardError
from proxy.upstream.remote_count import RemoteCounter


async def probe(counter: RemoteCounter, model: str) -> None:
    """Learn whether the upstream offers the render endpoints (one small chat rendered)."""
    if counter.renders is None:
        try:
            await counter.chat(model, {"messages": [{"role": "user", "content": "hi"}]})
        except GuardError:
            pass  # a model that refuses even this says nothing about the endpoints


def decide(model: GuardedModel, rows: Sequence[Row], counter: RemoteCounter) -> tuple[str, str]:
    """The model's count source and why, for a model whose configured source is "auto"."""
    bad = [r.sample for r in rows if r.verdict == MISMATCH]
    if not bad:
        return "auto", f"auto: the guard agreed with what vLLM charges on all {len(rows)} samples; counted locally"
    where = f"disagreed with what vLLM charges on {len(bad)} of {len(rows)} samples ({', '.join(bad)})"
    mode = model.tokenizer.rendering.mode
    if not counter.renders and counter.tokenizes is False:
        return "auto", (f"auto: the guard {where}, but the upstream offers no way to count (no render endpoints, no "
                        "POST /tokenize); counted locally")  # fmt: skip
    if upstream_counts(model, counter):
        return "upstream", f"auto: the guard {where}; vLLM counts this model's prompts ({counter.method})"
    return "auto", (
        f"auto: the guard {where}, but the upstream cannot count {mode} chat exactly (POST /tokenize renders it "
        "differently, and it offers no render endpoints: start vLLM with --enable-scale-out); counted locally"
    )


def upstream_counts(model: GuardedModel, counter: RemoteCounter) -> bool:
    """Whether the upstream can count this model's prompts exactly: its render endpoints, or POST /tokenize for a
    model rendered with a Jinja template."""
    if not counter.renders and counter.tokenizes is False:
        return False
    return bool(counter.renders) or model.tokenizer.rendering.mode == "hf"


async def apply(registry: ModelRegistry, rows: Sequence[Row], counter: RemoteCounter) -> None:
    for name in registry.names:
        model = registry.resolve(name)
        if model.count_source != "auto":
            continue
        await probe(counter, name)
        registry.set_count_source(name, *decide(model, [r for r in rows if r.model == name], counter))
