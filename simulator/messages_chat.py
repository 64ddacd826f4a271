"""An Anthropic Messages request as the chat request vLLM 0.31 / 0.32 render for it:
`AnthropicServingMessages.to_chat_completion_request` (entrypoints/anthropic/serving.py): the system text (billing
headers dropped, inline system messages merged in when the template needs the system first), the content blocks
(text, images, thinking, tool_use, tool_result), the tool choice, the thinking switch, 0.32's tool additions and
removals, and the tools. The simulator's own conversion, apart from the guard's."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from simulator.errors import ApiError
from simulator.messages_request import MessagesRequest

BILLING = "x-anthropic-billing-header"


@dataclass(frozen=True)
class MessagesChat:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    reasoning_effort: str | None
    thinking_token_budget: int | None


def messages_chat(
    req: MessagesRequest, newer: bool, merge_inline: bool, disabled_effort: str, joined: bool = False
) -> MessagesChat:
    """`merge_inline`: the start-up probe found the template refuses an inline system message; `disabled_effort`:
    the effort `thinking: disabled` maps to (0.31 applies thinking and output_config to count_tokens not at all);
    `joined`: a tool result's references and text are one tool message (0.34)."""
    messages = _system(req, merge_inline)
    for message in req.messages:
        _message(message, messages, merge_inline, joined)
    applies = newer or req.max_tokens is not None  # 0.31 returns early for AnthropicCountTokensRequest
    thinking = req.thinking if applies else None
    effort = req.effort if applies else None
    budget = None
    if thinking is not None and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
    elif thinking is not None and thinking.get("type") in ("disabled", "between_tools"):  # between_tools: 0.34
        effort = disabled_effort
    tools = _resolved_tools(req) if newer else req.tools
    choice = _choice(req.tool_choice)
    if tools is not None and choice is None:
        choice = "auto"
    shown = None if tools is None else [_tool(t) for t in tools]
    return MessagesChat(messages, shown, choice, effort, budget)


def _system(req: MessagesRequest, merge_inline: bool) -> list[dict[str, Any]]:
    parts: list[str] = []
    if isinstance(req.system, str) and req.system:
        parts.append(req.system)
    elif isinstance(req.system, list):
        parts += [b["text"] for b in req.system if b.get("type") == "text" and b.get("text")
                  and not b["text"].startswith(BILLING)]  # fmt: skip
    if merge_inline:
        parts += [text for m in req.messages if m.get("role") == "system" and (text := _system_text(m))]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _system_text(message: dict[str, Any]) -> str | None:
    content: str | list[dict[str, Any]] = message["content"]
    if isinstance(content, str):
        return None if content.startswith(BILLING) else content
    parts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")
             and not b["text"].startswith(BILLING)]  # fmt: skip
    return "".join(parts) or None


def _message(message: dict[str, Any], out: list[dict[str, Any]], merge_inline: bool, joined: bool) -> None:
    """_convert_messages: system messages in place (unless merged), the others block by block."""
    role: str = message["role"]
    content: str | list[dict[str, Any]] = message["content"]
    if role == "system":
        text = None if merge_inline else _system_text(message)
        if text:
            out.append({"role": "system", "content": text})
        return
    converted: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        converted["content"] = content
    else:
        _content(role, content, converted, out, joined)
    if not (role == "user" and "content" not in converted):
        out.append(converted)


def _content(
    role: str, blocks: list[dict[str, Any]], converted: dict[str, Any], out: list[dict[str, Any]], joined: bool
) -> None:
    """_convert_message_content: text and images as parts, thinking as reasoning, tool_use as tool calls; a user's
    tool_result becomes tool messages appended as they come."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append({"id": block.get("id") or f"call_{int(time.time())}", "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result" and role == "user":
            out += _tool_result(block, joined)
        elif kind == "tool_result":
            text = str(block.get("content")) if block.get("content") else ""
            parts.append({"type": "text", "text": f"Tool result: {text}"})
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if parts:
        single = len(parts) == 1 and parts[0]["type"] == "text"
        converted["content"] = parts[0]["text"] if single else parts


def _tool_result(block: dict[str, Any], joined: bool) -> list[dict[str, Any]]:
    """_convert_user_tool_result: the text (joined by newlines), then the images as a user message, then the tool
    references as a second tool message; 0.34 (`joined`): the references, then the text as a part, in the one tool
    message, before the images."""
    content = block.get("content")
    texts: list[str] = []
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(content, list):
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image" and (url := image_url(item.get("source", {}))):
                images.append(url)
            elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": name})
    text = content if isinstance(content, str) else "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    first: str | list[dict[str, Any]] = text or ""
    if joined and references:
        first = references + ([{"type": "text", "text": text}] if text else [])
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": first}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references and not joined:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def image_url(source: dict[str, Any]) -> str:
    """_convert_image_source_to_url: a url as it is, anything else a base64 data URI."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _choice(choice: dict[str, Any] | None) -> Any:
    if choice is None:
        return None
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def _resolved_tools(req: MessagesRequest) -> list[dict[str, Any]] | None:
    """0.32's _resolve_tools: the tools in effect after the system messages' additions and removals."""
    changes = [b for m in req.messages if isinstance(m.get("content"), list) for b in m["content"]
               if b.get("type") in ("tool_addition", "tool_removal")]  # fmt: skip
    if not changes:
        return req.tools
    tools = {t["name"]: t for t in req.tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change.get("type") == "tool_definition":
            name = change["definition"]["name"]
            tools[name] = change["definition"]
        else:
            name = change["name"]
            if name not in tools:  # a ValueError in vLLM's handler: its 400
                raise ApiError(f"{block['type']} references tool {name!r}, which is not declared in tools")
            if block["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        (removed.add if block["type"] == "tool_removal" else removed.discard)(name)
    return [t for name, t in tools.items() if name not in removed]


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """ChatCompletionToolsParam of an AnthropicTool (input_schema gets type "object" when it names none); strict and
    defer_loading only when set, as FunctionDefinition dumps them."""
    schema = tool["input_schema"] if "type" in tool["input_schema"] else {**tool["input_schema"], "type": "object"}
    function = {"name": tool["name"], "description": tool.get("description"), "parameters": schema}
    function |= {key: tool[key] for key in ("strict", "defer_loading") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def needs_system_first(template: str | dict[str, Any] | None, catches_any: bool = False) -> bool:
    """_detect_merge_inline_system, vLLM's start-up probe of each template it applies (with tools and without):
    [system, user, system, user] rendered in a plain sandboxed Jinja environment; any template error (Qwen's
    `loop.first` guard, an undefined `raise_exception`) means inline system messages get merged. `catches_any`
    (0.34's `except Exception`): so does any other error; 0.31-0.33 let it out of the probe, which stops the server's
    start-up. A processor's dict (0.31-0.33) is no template: Jinja refuses it (0.33's own probe stops the server's
    start-up on it)."""
    return isinstance(template, dict) or _fails_probe(template, catches_any)


@lru_cache(maxsize=16)  # vLLM probes once at start-up; here the server's own templates, each compiled once
def _fails_probe(template: str | None, catches_any: bool) -> bool:
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])  # fmt: skip
    probe = [{"role": role, "content": "t"} for role in ("system", "user", "system", "user")]
    try:
        env.from_string(template).render(messages=probe, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    except Exception:
        if catches_any:
            return True
        raise
    return False
