"""An Anthropic Messages request as the chat request vLLM renders for it, so that it is counted by the chat path.

vLLM serves `/v1/messages` by converting each request into a chat completions request (0.31/0.32
`entrypoints/anthropic/serving.py`: _convert_system_message, _convert_messages, _convert_block, _convert_tools,
_handle_output_config, _handle_thinking; 0.32 _resolve_tools). Mirrored here step by step; the two start-up probes
vLLM runs on the chat template (are inline system messages merged? what does `thinking: disabled` map to?) are in
anthropic_probes.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from proxy.api.anthropic import MessagesRequest
from proxy.api.chat import ChatRequest
from proxy.counting.anthropic_probes import disabled_thinking_effort, merges_inline_system
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import InvalidRequest

BILLING_HEADER = "x-anthropic-billing-header"
BLOCKS = frozenset({"text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"})
THINKING_OFF = ("disabled", "between_tools")  # between_tools: 0.34, "off up front", rendered as disabled
TOOL_EDITS = frozenset({"tool_addition", "tool_removal"})  # 0.32: system messages may edit the tool list


def messages_chat(tok: ModelTokenizer, req: MessagesRequest, newer: bool) -> ChatRequest:
    """The chat request vLLM renders for `req`; `newer`: the upstream is vLLM 0.32+."""
    return to_chat(req, newer, merges_inline_system(tok), lambda: disabled_thinking_effort(tok),
                   tok.tool_references_joined)  # fmt: skip


def to_chat(
    req: MessagesRequest, newer: bool, merge: bool, disabled_effort: Callable[[], str], joined: bool = False
) -> ChatRequest:
    """The conversion, given what vLLM's two probes found for the model's template (anthropic_probes.py); `joined`:
    a tool result's tool references and text go in one tool message (0.34+)."""
    _check_blocks(req, newer)
    messages = _system(req, merge) + _conversation(req.messages, merge, joined)
    tools = _tools(_edited_tools(req) if newer else req.tools)
    body: dict[str, Any] = {"messages": messages, "add_special_tokens": False}
    effort = _effort(req, newer, disabled_effort)
    if effort is not None:
        body["reasoning_effort"] = effort  # chat derives enable_thinking from it, unless the client set it
    response_format = _response_format(req)
    if response_format is not None:  # only mistral_common renders it (0.34+)
        body["response_format"] = response_format
    if tools is not None:
        body["tools"] = tools
    kwargs = req.body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if req.model is not None:
        body["model"] = req.model
    if req.body.get("kv_transfer_params") is not None:  # ids vLLM may run in place of the messages
        body["kv_transfer_params"] = req.body["kv_transfer_params"]
    return ChatRequest(
        body=body, model=req.model, messages=messages, tools=tools, add_generation_prompt=True,
        continue_final_message=False, add_special_tokens=False, chat_template=None, chat_template_kwargs=kwargs or {},
        max_tokens=None, max_completion_tokens=None, min_tokens=None, n=1, stream=req.stream,
    )  # fmt: skip


def _check_blocks(req: MessagesRequest, newer: bool) -> None:
    """Block types vLLM's request model accepts (its pydantic 400 otherwise)."""
    allowed = BLOCKS | TOOL_EDITS if newer else BLOCKS
    system = req.system if isinstance(req.system, list) else []
    lists = [(f"messages[{i}]", m["role"], m["content"]) for i, m in enumerate(req.messages)]
    for where, role, blocks in [("system", None, system), *lists]:
        if not isinstance(blocks, list):
            continue
        for block in blocks:
            kind = block["type"]
            if kind not in allowed or (kind in TOOL_EDITS and role != "system"):
                raise InvalidRequest(f"{where}: a {kind!r} block is not accepted here.", param="messages")


def _system(req: MessagesRequest, merge: bool) -> list[dict[str, Any]]:
    """The leading system message: the top-level system (blocks joined with "", billing-header blocks dropped), then,
    for templates that need the system prompt first, every inline system message's text."""
    parts: list[str] = []
    if isinstance(req.system, str) and req.system:
        parts.append(req.system)
    elif isinstance(req.system, list):
        parts += [b["text"] for b in req.system if _is_text(b) and not b["text"].startswith(BILLING_HEADER)]
    if merge:
        parts += [t for m in req.messages if m["role"] == "system" and (t := _inline_system_text(m["content"]))]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _is_text(block: dict[str, Any]) -> bool:
    return block.get("type") == "text" and isinstance(block.get("text"), str) and bool(block["text"])


def _inline_system_text(content: Any) -> str | None:
    """A string starting with the billing header is dropped whole; blocks as the top-level system's."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [b["text"] for b in content if _is_text(b) and not b["text"].startswith(BILLING_HEADER)]
    return "".join(parts) if parts else None


def _conversation(messages: list[dict[str, Any]], merge: bool, joined: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system":
            text = None if merge else _inline_system_text(content)
            if text:
                out.append({"role": "system", "content": text})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        message = _from_blocks(role, content, out, joined)
        if role != "user" or "content" in message:  # a user message of tool results only leaves nothing behind
            out.append(message)
    return out


def _from_blocks(role: str, blocks: list[dict[str, Any]], out: list[dict[str, Any]], joined: bool) -> dict[str, Any]:
    """One message's blocks; a user's tool results become tool messages, appended to `out` before it."""
    message: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":  # vLLM dumps the input with json.dumps' defaults, then parses it back
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name") or "", "arguments": arguments}
            call_id = block.get("id") or f"call_{int(time.time())}"
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            out.extend(_tool_result(block, joined))
        elif kind == "tool_result":  # in an assistant message: text, where str() of a list is Python's repr
            content = block.get("content")
            parts.append({"type": "text", "text": f"Tool result: {str(content) if content else ''}"})
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    return message


def _tool_result(block: dict[str, Any], joined: bool) -> list[dict[str, Any]]:
    """A tool message, then a user message with the result's images, then a tool message with its tool references;
    `joined` (0.34+): one tool message, its references first and then its text as a part, then the images."""
    call_id = block.get("tool_use_id") or ""
    content = block.get("content")
    text, images, refs = "", [], []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        items = [item for item in content if isinstance(item, dict)]
        text = "\n".join(item.get("text", "") for item in items if item.get("type") == "text")
        images = [url for item in items if item.get("type") == "image" and (url := _image_url(item.get("source", {})))]
        refs = [{"type": "tool_reference", "name": name} for item in items if item.get("type") == "tool_reference"
                and (name := item.get("tool_name") or item.get("name"))]  # fmt: skip
    first: str | list[dict[str, Any]] = text or ""
    if joined and refs:
        first = [*refs, *([{"type": "text", "text": text}] if text else [])]
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": first}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if refs and not joined:
        out.append({"role": "tool", "tool_call_id": call_id, "content": refs})
    return out


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _edited_tools(req: MessagesRequest) -> list[dict[str, Any]] | None:
    """0.32: tool_addition / tool_removal blocks of system messages edit the declared tools, in order."""
    edits = [b for m in req.messages if isinstance(m["content"], list) for b in m["content"] if b["type"] in TOOL_EDITS]
    if not edits:
        return req.tools
    tools = {t["name"]: dict(t) for t in req.tools or []}
    removed: set[str] = set()
    for block in edits:
        change = block.get("tool") or {}
        if change.get("type") == "tool_definition":
            name = change["definition"]["name"]
            tools[name] = dict(change["definition"])
        else:
            name = change.get("name")
            if name not in tools:
                raise InvalidRequest(f"{block['type']} references tool {name!r}, which is not declared in tools",
                                     param="messages")  # fmt: skip
            if block["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        (removed.add if block["type"] == "tool_removal" else removed.discard)(name)
    return [t for n, t in tools.items() if n not in removed]


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic tools as chat tools (the input schema gets `type: object` when it has none)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        schema = dict(tool["input_schema"])
        schema.setdefault("type", "object")
        function: dict[str, Any] = {"name": tool["name"], "description": tool.get("description"), "parameters": schema}
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _response_format(req: MessagesRequest) -> dict[str, Any] | None:
    """output_config.format with a non-empty schema, as the chat response_format vLLM makes of it (named after its
    type, `_handle_output_config`)."""
    config = req.body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if not isinstance(fmt, dict) or not fmt.get("schema"):
        return None
    kind = fmt.get("type", "json_schema")
    return {"type": kind, "json_schema": {"name": kind, "schema": fmt["schema"]}}


def _effort(req: MessagesRequest, newer: bool, disabled_effort: Callable[[], str]) -> str | None:
    """output_config.effort, overridden by `thinking: disabled` (0.31's count_tokens reads neither), and by 0.34's
    `between_tools`, which vLLM maps to disabled (older releases refuse it: their answer, not the count, then)."""
    if req.max_tokens is None and not newer:
        return None
    config, thinking = req.body.get("output_config"), req.body.get("thinking")
    effort = config.get("effort") if isinstance(config, dict) else None
    if isinstance(thinking, dict) and thinking.get("type") in THINKING_OFF:
        effort = disabled_effort()
    return effort if isinstance(effort, str) else None
