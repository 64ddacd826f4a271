"""The two checks vLLM runs on a model's chat template before it serves `/v1/messages`, which change how a Messages
request becomes a chat prompt (vLLM 0.31/0.32 `AnthropicServingMessages`):

- `_should_merge_inline_system`: render [system, user, system, user] in a bare sandbox; a template that fails (Qwen's
  "system message must be first", or any call the bare environment lacks) gets every inline system message merged
  into the leading system prompt;
- `_probe_disabled_thinking_effort` (`--anthropic-disabled-thinking-effort auto`): `thinking: {"type": "disabled"}`
  becomes reasoning_effort "none", unless "none" fails to render or renders like a real effort: then "low".

Both depend only on the template (and the server's default kwargs), so each is computed once per template.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from proxy.counting.conversation import ContentFormat, template_inputs, to_conversation
from proxy.counting.templates import TemplateError, render
from proxy.counting.tokenizer import ModelTokenizer

EFFORTS = ("low", "medium", "high", "xhigh", "max")
_PROBE = [{"role": "system", "content": "t"}, {"role": "user", "content": "t"}] * 2


def merges_inline_system(tok: ModelTokenizer) -> bool:
    """True when inline system messages go into the leading system prompt (checked on the template with and without
    tools, as vLLM checks both variants)."""
    return any(fails_inline_system(t) for t in {tok.template_for(None), tok.template_for([])})


@lru_cache(maxsize=64)  # bounded: one entry per template
def fails_inline_system(template: str | None) -> bool:
    """vLLM's probe: does the template refuse a system message after the first turn?"""
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    try:
        env.from_string(template).render(messages=_PROBE, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def disabled_thinking_effort(tok: ModelTokenizer) -> str:
    template = tok.template_for(None)
    if tok.native is not None or template is None:
        # mistral_common and harmony do not render "none" differently from an effort (not checked against vLLM)
        return "low"
    state = json.dumps([tok.special_tokens, dict(tok.default_kwargs)], sort_keys=True, default=str)
    return _probe_effort(template, tok.content_format(template), state)


@lru_cache(maxsize=64)
def _probe_effort(template: str, content_format: ContentFormat, state: str) -> str:
    specials, defaults = json.loads(state)
    conversation = to_conversation([{"role": "user", "content": "Hi"}], content_format)

    def rendered(effort: str) -> str | None:
        variables: dict[str, Any] = {**specials, **template_inputs({"reasoning_effort": effort}, {}, defaults)}
        try:
            return render(template, True, conversation, None, True, False, variables)
        except TemplateError:
            return None

    none = rendered("none")
    if none is None or any(rendered(effort) == none for effort in EFFORTS):
        return "low"
    return "none"
