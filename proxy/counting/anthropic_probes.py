"""The two checks vLLM runs on a model's chat template before it serves `/v1/messages`, which change how a Messages
request becomes a chat prompt (vLLM 0.31/0.32 `AnthropicServingMessages`):

- `_should_merge_inline_system`: render [system, user, system, user] in a bare sandbox; a template that fails (Qwen's
  "system message must be first", or any call the bare environment lacks) gets every inline system message merged
  into the leading system prompt. A model rendered by mistral_common has no template there: up to 0.33 vLLM probes
  its --chat-template (none: merged); 0.34 renders [SYSA, USRA, SYSB, USRB] through mistral_common and keeps inline
  system messages only if they come out in order as system turns of their own, a trailing one still followed by the
  generation prompt (`_renderer_keeps_inline_system`; mistral_common 1.13 merges for every tokenizer version).
  Up to 0.33 only a template error counts as failing, and any other error (a TypeError, say) stops the server's
  start-up; 0.34 reads any error as failing;
- `_probe_disabled_thinking_effort` (`--anthropic-disabled-thinking-effort auto`): `thinking: {"type": "disabled"}`
  becomes reasoning_effort "none", unless "none" fails to render or renders like a real effort: then "low". The
  probe renders through the model's renderer, mistral_common included (harmony refuses "none").

Both depend only on the template (and the server's default kwargs) or the mistral_common tokenizer, so each is
computed once per template or tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from proxy.counting.conversation import ContentFormat, template_inputs, to_conversation
from proxy.counting.mistral import MistralChat
from proxy.counting.templates import TemplateError, render
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import GuardError

EFFORTS = ("low", "medium", "high", "xhigh", "max")
_PROBE = [{"role": "system", "content": "t"}, {"role": "user", "content": "t"}] * 2
MARKERS = ("SYSA", "USRA", "SYSB", "USRB")


def merges_inline_system(tok: ModelTokenizer) -> bool:
    """True when inline system messages go into the leading system prompt (checked on the template with and without
    tools, as vLLM checks both variants; for mistral_common, as the upstream's release checks it)."""
    if isinstance(tok.native, MistralChat):
        if tok.mistral_034:
            return not _mistral_keeps_inline_system(tok.native)
        return fails_inline_system(tok.configured_template, tok.probe_catches_any)
    return any(fails_inline_system(t, tok.probe_catches_any) for t in {tok.template_for(None), tok.template_for([])})


@lru_cache(maxsize=64)  # bounded: one entry per loaded mistral_common tokenizer
def _mistral_keeps_inline_system(native: MistralChat) -> bool:
    return keeps_inline_system(native.prompt_text)


def keeps_inline_system(render_prompt: Callable[[list[dict[str, Any]]], str]) -> bool:
    """vLLM 0.34's probe of a renderer that is not a template: are inline system messages rendered in order, as
    system turns of their own (not as user text), a trailing one still followed by the generation prompt?"""
    messages = [{"role": role, "content": marker} for role, marker in zip(("system", "user") * 2, MARKERS, strict=True)]
    try:
        full = render_prompt(messages)
        trailing = render_prompt(messages[:3])
        as_user = render_prompt([*messages[:2], {**messages[2], "role": "user"}])
    except Exception:  # vLLM: a renderer that refuses the probe keeps nothing
        return False
    positions = [full.find(marker) for marker in MARKERS]
    if -1 in positions or positions != sorted(positions):
        return False
    separator = _between(full)
    if not separator.strip() or separator == _between(as_user):
        return False
    generation_prompt = full[positions[-1] + len(MARKERS[-1]) :]
    return trailing.endswith(MARKERS[2] + generation_prompt)


def _between(text: str) -> str:
    return text[text.find(MARKERS[1]) + len(MARKERS[1]) : text.find(MARKERS[2])]


@lru_cache(maxsize=64)  # bounded: one entry per template and release rule
def fails_inline_system(template: str | None, catches_any: bool = False) -> bool:
    """vLLM's probe: does the template refuse a system message after the first turn? `catches_any` (0.34+): any error
    of the render says so; up to 0.33 only a template error does, and any other (a filter's TypeError on a variable
    the bare probe leaves undefined) stops vLLM's start-up, which the guard tells as its own error."""
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    try:
        env.from_string(template).render(messages=_PROBE, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    except Exception as exc:  # the template is the model's: anything can come out of it
        if catches_any:
            return True
        raise GuardError(
            f"the model's chat template fails vLLM's inline-system probe with {type(exc).__name__}: {exc}; vLLM up "
            "to 0.33 does not start with such a template (0.34 merges inline system messages for it)"
        ) from None
    return False


def disabled_thinking_effort(tok: ModelTokenizer) -> str:
    template = tok.template_for(None)
    if isinstance(tok.native, MistralChat):
        return _mistral_disabled_effort(tok.native)
    if tok.native is not None or template is None:
        return "low"  # harmony: "none" is refused
    state = json.dumps([tok.special_tokens, dict(tok.default_kwargs)], sort_keys=True, default=str)
    return _probe_effort(template, tok.content_format(template), state)


@lru_cache(maxsize=64)  # bounded: one entry per loaded mistral_common tokenizer
def _mistral_disabled_effort(native: MistralChat) -> str:
    """vLLM renders the probe through mistral_common: a tokenizer before v15 ignores the effort (0.31-0.33) or
    refuses it (0.34), and a v15 one refuses an effort its file does not list, or renders one it does as a model
    setting."""
    hi = [{"role": "user", "content": "Hi"}]

    def rendered(effort: str) -> list[int] | None:
        if native.version < 15:
            return []  # the same prompt for every effort (0.31-0.33); refused (0.34): "low" either way
        try:
            return native.prompt_ids(hi, effort)
        except Exception:  # mistral_common's refusals
            return None

    none = rendered("none")
    if none is None or any(rendered(effort) == none for effort in EFFORTS):
        return "low"
    return "none"


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
