"""Turn OpenAI chat messages into the "conversation" vLLM hands to the chat template (wire contract, section 12.1).

vLLM joins the text parts of list content with "\\n" for templates that treat content as a string, keeps them as
`{"type": "text", "text": ...}` parts for templates that loop over `message['content']`, and parses tool-call
arguments from JSON strings into objects. Counting exactly means reproducing each of these steps.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from typing import Any, Literal

import jinja2
import jinja2.nodes as jn

ContentFormat = Literal["string", "openai"]

_TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal")


class ConversationError(ValueError):
    """A message the template cannot be given: the text says which one and why."""


def to_conversation(messages: list[Any], content_format: ContentFormat) -> list[dict[str, Any]]:
    conversation = [_convert_message(i, m, content_format) for i, m in enumerate(messages)]
    _parse_tool_call_arguments(conversation)
    return conversation


def _convert_message(index: int, message: Any, content_format: ContentFormat) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ConversationError(f"messages[{index}] must be an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise ConversationError(f"messages[{index}].role must be a string")
    texts = _content_texts(index, message.get("content"))
    content: Any = [{"type": "text", "text": t} for t in texts] if content_format == "openai" else "\n".join(texts)
    if role == "tool" and isinstance(content, list):  # most templates only handle string tool results
        content = "\n".join(texts)
    converted: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            converted["tool_calls"] = _copy_tool_calls(index, message["tool_calls"])
        if message.get("reasoning") is not None:
            converted["reasoning"] = converted["reasoning_content"] = message["reasoning"]
    if role == "tool" and "tool_call_id" in message:
        converted["tool_call_id"] = message["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            converted[key] = message[key]
    if role == "developer":
        converted["tools"] = message.get("tools")
    return converted


def _content_texts(index: int, content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ConversationError(f"messages[{index}].content must be a string, a list of parts or null")
    texts = []
    for j, part in enumerate(content):
        text = _part_text(part)
        if text is None:
            raise ConversationError(
                f"messages[{index}].content[{j}] is not a text part; this guard counts text-only prompts"
            )
        texts.append(text)
    return texts


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    key = "refusal" if kind == "refusal" else "text"
    if kind in _TEXT_PART_TYPES and isinstance(part.get(key), str):
        return str(part[key])
    return None


def _copy_tool_calls(index: int, calls: Any) -> list[Any]:
    if not isinstance(calls, list):
        raise ConversationError(f"messages[{index}].tool_calls must be a list")
    copied = []
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            call = {**call, "function": dict(call["function"])}
        copied.append(call)
    return copied


def _parse_tool_call_arguments(conversation: list[dict[str, Any]]) -> None:
    # vLLM hands templates the arguments as objects, as transformers' tool-use templates expect; missing or
    # malformed arguments become {} so that one bad turn in the history does not fail every later request.
    for message in conversation:
        calls = message.get("tool_calls")
        if calls == []:
            del message["tool_calls"]
        for call in calls or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or call.get("type", "function") != "function":
                raise ConversationError("assistant tool_calls entries must be objects of type 'function'")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    parsed = {}
                function["arguments"] = parsed if isinstance(parsed, dict) else {}


# --- content-format detection: the same walk over the template's syntax tree that vLLM's "auto" mode does ---


def detect_content_format(chat_template: str) -> ContentFormat:
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        return "string"
    return "openai" if next(_content_loops(ast), None) is not None else "string"


def _is_var(node: jn.Node, name: str) -> bool:
    return isinstance(node, jn.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jn.Node, name: str, key: str) -> bool:
    if isinstance(node, jn.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jn.Const) and node.arg.value == key
    if isinstance(node, jn.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_access(node: jn.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jn.Filter):
        return node.node is not None and _is_access(node.node, name, key)
    if isinstance(node, jn.Test):
        return _is_access(node.node, name, key)
    if isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Slice):
        return _is_access(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _aliases(root: jn.Template, name: str) -> Iterator[str]:
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jn.Assign):
            if isinstance(assign.target, jn.Name) and _is_access(assign.node, current):
                yield assign.target.name
                if assign.target.name != current:
                    pending.append(assign.target.name)


def _loop_targets(root: jn.Template, iterables: list[str], key: str | None) -> Iterator[str]:
    for loop in root.find_all(jn.For):
        if isinstance(loop.target, jn.Name) and any(_is_access(loop.iter, n, key) for n in iterables):
            yield loop.target.name


def _content_loops(root: jn.Template) -> Iterator[str]:
    message_names = list(_loop_targets(root, list(_aliases(root, "messages")), None))
    return _loop_targets(root, message_names, "content")


def to_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's request model re-serializes them before the template sees them: only the known keys, in its
    order, with `description` and `parameters` null when absent. That changes what `tools | tojson` renders."""
    if tools is None:
        return None
    normalized = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConversationError(f"tools[{i}] must be an object with a 'function' that has a string 'name'")
        out: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            out["strict"] = function["strict"]
        defer_loading = function.get("defer_loading", tool.get("defer_loading"))
        if defer_loading is not None:
            out["defer_loading"] = defer_loading
        entry: dict[str, Any] = {"type": "function", "function": out}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        normalized.append(entry)
    return normalized


RESERVED_TEMPLATE_KWARGS = frozenset({"conversation", "chat_template", "tokenize", "return_dict", "tools"})


def template_inputs(body: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The extra variables vLLM hands the template: the client's chat_template_kwargs (minus reserved names), then
    `documents` and `reasoning_effort` from the request (and `enable_thinking` derived from the latter)."""
    merged = {k: v for k, v in kwargs.items() if k not in RESERVED_TEMPLATE_KWARGS}
    effort = body.get("reasoning_effort")
    extra: dict[str, Any] = {"documents": body.get("documents"), "reasoning_effort": effort}
    if effort is not None and "enable_thinking" not in kwargs:
        extra["enable_thinking"] = effort != "none"
    merged.update({k: v for k, v in extra.items() if v is not None})
    return merged
