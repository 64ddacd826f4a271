"""Chat messages as vLLM hands them to a chat template: the simulator's own reading, written from vLLM 0.31 and 0.32
(`renderers/chat_utils.py`: `_parse_chat_message_content` and `_postprocess_messages`; `renderers/hf.py`: the
developer role and the content format; the chat request model's `_normalize_messages_before` and tool models).

The guard has a reading of its own (proxy/counting/); this one never borrows it, so that a test of the guard against
the simulator fails where the guard reads a message otherwise than vLLM.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from simulator.errors import ApiError, validation_error

ContentFormat = Literal["string", "openai"]

# MM_PARSER_MAP's text types and the field each reads; vLLM skips a part whose value is None only for the first two.
TEXT_TYPES = {"text": "text", "refusal": "refusal", "input_text": "text", "output_text": "text", "thinking": "thinking"}
SKIPPED_WHEN_NONE = ("text", "refusal")
# The media part types, each with the modality a text-only model refuses (the tracker's validate_num_items).
MEDIA_TYPES = {"image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
               "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video",
               "video_embeds": "video", "prompt_embeds": "prompt_embeds"}  # fmt: skip
# `_KNOWN_CONTENT_PART_FIELDS` (every key of the content part TypedDicts): the keys an "openai" text part loses.
KNOWN_PART_FIELDS = frozenset(
    {"audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url", "input_audio",
     "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid", "video_embeds", "video_url"}
)  # fmt: skip
BILLING_HEADER = "x-anthropic-billing-header"  # vLLM 0.32+: Claude Code's attribution line, off system text


def read_messages(messages: list[Any], content_format: ContentFormat, strips_billing: bool) -> list[dict[str, Any]]:
    """`parse_chat_messages`: each message parsed, then the tool calls' arguments made objects."""
    conversation = [_message(i, _normalized(i, m), content_format, strips_billing) for i, m in enumerate(messages)]
    for message in conversation:
        _postprocess(message)
    return conversation


def _normalized(index: int, message: Any) -> dict[str, Any]:
    """The request model's `_normalize_messages_before`: `reasoning_content` renamed `reasoning`."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise validation_error(f"messages.{index}: each message must be an object with a string 'role'.")
    normalized: dict[str, Any] = dict(message)
    reasoning_content = normalized.pop("reasoning_content", None)
    if reasoning_content is not None and normalized.get("reasoning") is None:
        normalized["reasoning"] = reasoning_content
    return normalized


def _message(index: int, message: dict[str, Any], content_format: ContentFormat, strips: bool) -> dict[str, Any]:
    role = message["role"]
    content = message.get("content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    elif not isinstance(content, list):
        raise validation_error(f"messages.{index}.content: a string, a list of content parts or null.")
    if role == "system" and strips:
        content = _without_billing_header(content)
    wrap = content_format == "openai"
    parts = [part for part in (_part(p, wrap) for p in content) if part]
    result: dict[str, Any] = {"role": role, "content": parts if wrap else "\n".join(parts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = [_validated_call(call) for call in message["tool_calls"]]
        if message.get("reasoning") is not None:
            result["reasoning"] = result["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(result["content"], list) and all(
            isinstance(item, dict) and item.get("type") == "text" for item in result["content"]
        ):  # tool results joined whatever the format, unless a part is not text (a tool_reference)
            result["content"] = "\n".join(item.get("text", "") for item in result["content"])
    result |= {key: message[key] for key in ("name", "task") if isinstance(message.get(key), str)}
    return result | {"tools": message.get("tools")} if role == "developer" else result


def _part(part: Any, wrap: bool) -> Any:
    """`_parse_chat_message_content_part`: a text part's text (or its dict), None for a part dropped."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    if not isinstance(part, dict):
        raise validation_error("Invalid content part: an object or a string.", parameter="messages")
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        kind = next((key for key in MEDIA_TYPES if key in part), "tool_reference" if "tool_reference" in part else None)
        if kind is None:
            raise validation_error("Missing 'type' field in multimodal part.", parameter="type")
    if not isinstance(kind, str):
        raise validation_error("Invalid 'type' field in multimodal part.", parameter="type")
    if kind in TEXT_TYPES:
        text = part.get(TEXT_TYPES[kind])
        if text is None and kind in SKIPPED_WHEN_NONE:
            return None
        if not wrap:
            return text
        return {"type": "text", "text": text, **{k: v for k, v in part.items() if k not in KNOWN_PART_FIELDS}}
    if kind == "tool_reference":
        return {"type": "tool_reference", "name": part.get("name")} if wrap else part.get("name")
    if kind in MEDIA_TYPES:  # the simulator's model is a text-only one: its processor takes no item of any modality
        raise validation_error(f"At most 0 {MEDIA_TYPES[kind]}(s) may be provided in one prompt.")
    supported = sorted({*TEXT_TYPES, *MEDIA_TYPES, "tool_reference"})
    raise validation_error(
        f"Unsupported chat content part type: {kind!r}. Supported types: {', '.join(supported)}.",
        parameter="type",
        value=kind,
    )


def _without_billing_header(parts: list[Any]) -> list[Any]:
    kept = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        if isinstance(part, dict) and part.get("type") != "text":
            text = None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            kept.append(part)
        elif rest := text.partition("\n")[2]:
            kept.append(rest if isinstance(part, str) else {**part, "text": rest})
    return kept


def _validated_call(call: Any) -> Any:
    """A tool call as pydantic validates it into OpenAI's typed dicts: their keys in declaration order (id, function
    with arguments before name, type; other keys after), which a template dumping a call with `tojson` shows."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    return _in_declared_order({**call, "function": _in_declared_order(call["function"], CALL_FUNCTION)}, CALL)


CALL = ("id", "function", "type")  # ChatCompletionMessageFunctionToolCallParam
CALL_FUNCTION = ("arguments", "name")  # its Function


def _in_declared_order(fields: dict[str, Any], declared: tuple[str, ...]) -> dict[str, Any]:
    return {key: fields[key] for key in sorted(fields, key=lambda k: declared.index(k) if k in declared else 99)}


def _postprocess(message: dict[str, Any]) -> None:
    """`_postprocess_messages`: no empty tool call list; each call's arguments an object ({} when they are not)."""
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not isinstance(calls, list):
        return
    if not calls:
        del message["tool_calls"]
    for call in calls:
        if not isinstance(call, dict):
            raise validation_error("assistant tool_calls entries must be objects.", parameter="tool_calls")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise validation_error(
                "chat completions only support assistant tool_calls of type 'function'.", parameter="tool_calls"
            )
        function["arguments"] = _arguments(function.get("arguments"))


def _arguments(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:  # a malformed turn in the history must not fail every later request
            return {}
    return value if isinstance(value, dict) else {}


# --- the developer role (renderers/hf.py `safe_apply_chat_template`) ---


@lru_cache(maxsize=32)
def names_developer(template: str) -> bool:
    return '"developer"' in template or "'developer'" in template


def for_template(conversation: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """A template that never names the developer role gets those messages as system messages, then every system
    message merged into one at the start (`_convert_developer_to_system`, `_consolidate_system_messages`)."""
    if names_developer(template) or all(m["role"] != "developer" for m in conversation):
        return conversation
    converted = [{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer"
                 else m for m in conversation]  # fmt: skip
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(texts)
        if text := _joined(message.get("content", "")):
            texts.append(text)
    return [{"role": "system", "content": "\n\n".join(texts)}, *others] if merge else converted


def _joined(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return "\n".join(p["text"] if isinstance(p, dict) else p for p in content
                     if (isinstance(p, dict) and "text" in p) or isinstance(p, str))  # fmt: skip


# --- the tools a chat request's model re-serializes (FunctionDefinition, ChatCompletionToolsParam) ---


def read_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """`[tool.model_dump() for tool in request.tools]`: the known fields in the models' order, `description` and
    `parameters` null when absent, `strict` and `defer_loading` only when set (the tool's own passed down)."""
    return [_tool(i, tool) for i, tool in enumerate(tools)]


def _tool(index: int, tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(f"tools.{index}.function.name: Input should be a valid string")
    if tool.get("type", "function") != "function":
        raise ApiError(f"tools.{index}.type: Input should be 'function'")
    dumped: dict[str, Any] = {key: function.get(key) for key in ("name", "description", "parameters")}
    defer = function.get("defer_loading") if function.get("defer_loading") is not None else tool.get("defer_loading")
    dumped |= {key: value for key, value in (("strict", function.get("strict")), ("defer_loading", defer))
               if value is not None}  # fmt: skip
    entry: dict[str, Any] = {"type": "function", "function": dumped}
    if tool.get("defer_loading") is not None:
        entry["defer_loading"] = tool["defer_loading"]
    return entry
