"""Chat templates compiled once, in the environment transformers renders them in (the same options, filters and
globals), and rendered the way its `apply_chat_template(tokenize=False)` renders them as vLLM calls it.

The model's own template (from its files or the operator's config) is trusted: when its syntax tree holds nothing the
immutable sandbox would stop (a method call that changes a list or dict, a `_private` attribute, a format string), it
runs in a plain environment, which renders the same text at half the cost. Anything else, and every template a request
brings, runs in the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as jn
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# What the immutable sandbox refuses, or treats differently, on plain data: calls that modify a container, and
# format strings (which it runs through its own formatter).
SANDBOXED_CALLS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort", "reverse",
     "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update", "appendleft",
     "extendleft", "popleft", "rotate", "format", "format_map", "mro"}
)  # fmt: skip


RenderArgs = tuple[str, bool, list[dict[str, Any]], list[dict[str, Any]] | None, bool, bool, Mapping[str, Any]]
"""render()'s arguments: source, trusted, conversation, tools, add_generation_prompt, continue_final_message,
variables."""


class TemplateError(ValueError):
    """The template refused these inputs (its own raise_exception, or a rendering error): the text says why."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask blocks): render the body, as transformers
    does when no mask is asked for."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jn.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jn.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' own filter: Jinja's escapes HTML characters
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _environment(sandboxed: bool) -> jinja2.Environment:
    kind = ImmutableSandboxedEnvironment if sandboxed else jinja2.Environment
    env = kind(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


_PLAIN = _environment(sandboxed=False)
_SANDBOX = _environment(sandboxed=True)


def needs_sandbox(source: str) -> bool:
    """True when the template's syntax tree calls a method the immutable sandbox refuses or handles itself, or
    touches an underscore attribute: rendering it outside the sandbox could differ."""
    try:
        ast = _SANDBOX.parse(source)
    except jinja2.TemplateSyntaxError:
        return True
    for node in ast.find_all(jn.Getattr):
        if node.attr.startswith("_") or node.attr in SANDBOXED_CALLS:
            return True
    for item in ast.find_all(jn.Getitem):
        if isinstance(item.arg, jn.Const) and isinstance(item.arg.value, str) and item.arg.value.startswith("_"):
            return True
    return False


@lru_cache(maxsize=64)
def compiled(source: str, trusted: bool) -> jinja2.Template:
    """The template, compiled once; outside the sandbox only when trusted and nothing in it needs the sandbox."""
    env = _PLAIN if trusted and not needs_sandbox(source) else _SANDBOX
    try:
        template = env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from None
    # jinja keeps a template's globals as a ChainMap over its environment's, which every render copies into a new
    # context key by key, in Python: a third of a small chat's render. The environments' globals are set once, above.
    template.globals = dict(template.globals)
    return template


def render(
    source: str,
    trusted: bool,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
    variables: Mapping[str, Any],
) -> str:
    """The prompt text, as `apply_chat_template(conversation, tools=..., tokenize=False, ...)` renders it (documents
    and the other template variables come in `variables`, the tokenizer's special tokens among them)."""
    template = compiled(source, trusted)
    final: str | None = None
    if continue_final_message:
        conversation, final = _tag_final_message(source, conversation)
    try:
        text = template.render(
            messages=conversation, tools=tools, add_generation_prompt=add_generation_prompt,
            **{"documents": None, **variables},
        )  # fmt: skip
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from None
    except Exception as exc:  # templates index, call and compare whatever the conversation holds
        raise TemplateError(f"{type(exc).__name__}: {exc}") from None
    return _cut_at_tag(text, final) if final is not None else text


def _tag_final_message(source: str, conversation: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """transformers marks the end of the message to continue, renders, then cuts the prompt there."""
    if not conversation or conversation[-1].get("content") is None:
        raise TemplateError('continue_final_message is set but the final message has no "content" to continue!')
    if "content" not in source:
        raise TemplateError('continue_final_message is set to "content" but this is not an accepted field in the '
                            "chat_template")  # fmt: skip
    last = json.loads(json.dumps(conversation[-1]))
    content = last["content"]
    if isinstance(content, list | tuple):
        for block in reversed(content):
            if "text" in block:
                final = block["text"]
                block["text"] = final + CONTINUE_TAG
                break
        else:
            raise TemplateError("continue_final_message is set but we could not find any text to continue in the "
                                "final message!")  # fmt: skip
    else:
        final = content
        last["content"] = content + CONTINUE_TAG
    return [*conversation[:-1], last], final


def _cut_at_tag(text: str, final: str) -> str:
    tag = CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise TemplateError("continue_final_message is set but the final message does not appear in the chat after "
                            "applying the chat template!")  # fmt: skip
    at = text.rindex(tag)
    return text[:at] if text[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()
