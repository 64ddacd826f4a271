"""Learn a server's --default-chat-template-kwargs from the upstream, where it shows: vLLM's POST /tokenize applies
them, so for a template-rendered model whose template reads a known switch, the guard tries the switch's values on a
plain request and adopts the one that makes its count equal vLLM's (a Qwen3 served with thinking off by default is
otherwise 4 tokens short on every request that does not set the switch itself)."""

from __future__ import annotations

import logging
from typing import Any

from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.drift.compare import Refusal
from proxy.drift.samples import Sample
from proxy.drift.sides import guard_count, upstream_count
from proxy.upstream.client import Upstream

log = logging.getLogger("token_guard.check")

SWITCHES = ("enable_thinking", "thinking")  # template variables servers commonly default
PROBE = Sample("probe", "chat", {"messages": [{"role": "user", "content": "Hello!"}]})


async def learn(registry: ModelRegistry, upstream: Upstream) -> None:
    for name in registry.names:
        model = registry.resolve(name)
        found = await _learned(model, upstream)
        if found:
            registry.set_default_kwargs(name, found)
            log.warning("model %s: the upstream renders with default_chat_template_kwargs %s (learned from its POST "
                        "/tokenize); configure them to make this explicit", name, found)  # fmt: skip


async def _learned(model: GuardedModel, upstream: Upstream) -> dict[str, Any] | None:
    tok = model.tokenizer
    template = tok.template_for(None)
    if tok.rendering.mode != "hf" or tok.default_kwargs or not template:
        return None
    switches = [s for s in SWITCHES if s in template]
    if not switches:
        return None
    theirs = await upstream_count(upstream, model.name, PROBE)
    if isinstance(theirs, Refusal) or await guard_count(model, PROBE) == theirs:
        return None
    for switch in switches:
        for value in (False, True):
            candidate = {switch: value}
            probe = Sample("probe", "chat", {**PROBE.body, "chat_template_kwargs": candidate})
            if await guard_count(model, probe) == theirs:
                return candidate
    return None
