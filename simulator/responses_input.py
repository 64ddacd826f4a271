"""A Responses request's `input` as vLLM 0.31 to 0.34 read it and turn it into chat messages: each item as the request
model validates it (`input_item_parsing`, then the union of the SDK's input and output items), then
`construct_input_messages`, `construct_chat_messages_with_tool_call` and `_construct_message_from_response_item`
(responses/utils.py), and `should_continue_final_message`. The simulator's own reading, apart from the guard's.

`fills`: vLLM 0.34, which first fills in what an OpenResponses assistant or reasoning item leaves out
(`_normalize_openresponses_input_item`: the type, an id, status "completed", an empty summary), and converts an
output message without content and the reasoning and assistant items that stay dicts (0.33: a 500, a 400, the
message as it is)."""

from __future__ import annotations

import copy
import json
from typing import Any

from simulator.errors import ApiError, request_validation_error, validation_error

Item = dict[str, Any]  # the item's fields, with "kind": how vLLM holds it after validation
ROLES = ("user", "assistant", "system", "developer")
INPUT_PARTS = {"input_text": "text", "input_image": None, "input_file": None, "input_audio": "input_audio"}
# Items of the SDK's union that validate but that vLLM does not turn into messages: "Unsupported input item type"
OTHER_ITEMS = frozenset({
    "item_reference", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "mcp_call", "shell_call", "shell_call_output",
    "apply_patch_call", "apply_patch_call_output", "compaction",
})  # fmt: skip
CONTINUING = ("in_progress", "incomplete")
STATUSES = ("in_progress", "completed", "incomplete")
ITERABLE = (list, dict, str)  # JSON values a TypedDict's Iterable[...] field takes (validated only when iterated)


def read_items(items: list[Any], newer: bool, fills: bool = False) -> list[Item]:
    """Each item validated as the request model validates it; a 400 as pydantic's when one fits no SDK type."""
    read = [_item(i, item, fills) for i, item in enumerate(items)]
    bad = [i for i, item in enumerate(read) if item is None]
    if bad:
        errors = [str({"type": "union_tag_invalid", "loc": f"body.input.{i}", "msg": "Input fits no input item",
                       "input": str(items[i])[:200]}) for i in bad]  # fmt: skip
        raise request_validation_error(errors, param="input")
    return [item for item in read if item is not None]


def _item(index: int, item: Any, fills: bool) -> Item | None:
    if not isinstance(item, dict):
        return None
    original, item = item, _filled(item) if fills else item
    kind = item.get("type")
    if kind == "function_call":
        return {**item, "kind": kind} if _strings(item, "arguments", "call_id", "name") else None
    if kind == "reasoning":
        return _reasoning(item if fills or "id" in item else {**item, "id": "rs_sim"})
    if kind in ("function_call_output", "custom_tool_call_output"):
        ok = isinstance(item.get("call_id"), str) and isinstance(item.get("output"), str | list)
        return {**item, "kind": kind} if ok else None
    if kind == "custom_tool_call":
        return {**item, "kind": kind} if _strings(item, "call_id", "name", "input") else None
    if kind in OTHER_ITEMS:
        return {**item, "kind": "other"}
    if kind not in (None, "message") or item.get("role") not in ROLES:
        return None
    if kind == "message" and item.get("role") == "assistant" and isinstance(item.get("content"), list):
        typed = item if fills else {**item, "status": item.get("status", "completed")}  # 0.33 fills status alone
        if typed.get("status") in STATUSES and _output_message(item["content"]):
            return {**typed, "kind": "output_message"}
    return _input_message(original)  # a failed assistant item goes on as sent, unfilled


def _filled(item: dict[str, Any]) -> dict[str, Any]:
    """0.34's _normalize_openresponses_input_item."""
    kind = item.get("type", "message")
    if kind != "reasoning" and not (kind == "message" and item.get("role") == "assistant"):
        return item
    filled = {**item, "type": kind}
    if filled.get("id") in (None, ""):
        filled["id"] = "rs_sim" if kind == "reasoning" else "msg_sim"
    if filled.get("status") in (None, ""):
        filled["status"] = "completed"
    if kind == "reasoning" and filled.get("summary") is None:
        filled["summary"] = []
    return filled


def _strings(item: dict[str, Any], *keys: str) -> bool:
    return all(isinstance(item.get(key), str) for key in keys)


def _reasoning(item: dict[str, Any]) -> Item | None:
    """ResponseReasoningItem (a summary list, content none or a list, each part typed); failing that, the SDK's
    ResponseReasoningItemParam TypedDict, whose summary and content are any iterable, checked only when iterated:
    the item stays a dict ("reasoning_dict")."""
    summary, content = item.get("summary"), item.get("content")
    if not isinstance(item.get("id"), str) or not isinstance(item.get("encrypted_content"), str | None):
        return None
    typed = _typed_parts(summary, "summary_text") and (content is None or _typed_parts(content, "reasoning_text"))
    if typed and item.get("status") in (None, *STATUSES):
        return {**item, "kind": "reasoning"}
    loose = isinstance(summary, ITERABLE) and ("content" not in item or isinstance(content, ITERABLE))
    return {**item, "kind": "reasoning_dict"} if loose and item.get("status", "completed") in STATUSES else None


def _typed_parts(parts: Any, kind: str) -> bool:
    return isinstance(parts, list) and all(
        isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str) for p in parts
    )


def _output_message(content: Any) -> bool:
    """ResponseOutputMessage's content: output_text and refusal parts."""
    if not isinstance(content, list):
        return False
    return all(isinstance(p, dict) and (p.get("type") == "output_text" and isinstance(p.get("text"), str)
               or p.get("type") == "refusal" and isinstance(p.get("refusal"), str)) for p in content)  # fmt: skip


def _input_message(item: dict[str, Any]) -> Item | None:
    """EasyInputMessageParam / Message: a string, or input parts (an image's detail defaults to "auto")."""
    content = item.get("content")
    if isinstance(content, str):
        return {"kind": "message", "message": item}
    if not isinstance(content, list):
        return None
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in INPUT_PARTS:
            return None
        field = INPUT_PARTS[part["type"]]
        if field is not None and field not in part:
            return None
        parts.append({**part, "detail": "auto"} if part["type"] == "input_image" and "detail" not in part else part)
    return {"kind": "message", "message": {**item, "content": parts}}


def continues(items: str | list[Item]) -> bool:
    """should_continue_final_message: the last item is an unfinished message or reasoning item."""
    if isinstance(items, str) or not items:
        return False
    last = items[-1]
    if last["kind"] in ("output_message", "reasoning", "reasoning_dict"):
        return last.get("status") in CONTINUING
    if last["kind"] == "message":
        return last["message"].get("type", "message") == "message" and last["message"].get("status") in CONTINUING
    return False


def input_messages(
    instructions: str | None, items: str | list[Item], newer: bool, history: list[dict[str, Any]] | None = None,
    fills: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """construct_input_messages: the instructions, the stored conversation continued (already without its system
    messages, then the previous output's text: stored.py), then the new input."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    messages += copy.deepcopy(history or [])
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    converted: list[dict[str, Any]] = []
    for item in copy.deepcopy(items):
        message = _from_item(item, converted[-1] if converted else None, newer, fills)
        if message is not None:
            converted.append(message)
    return messages + converted


def _from_item(item: Item, prev: dict[str, Any] | None, newer: bool, fills: bool) -> dict[str, Any] | None:
    """_construct_message_from_response_item: a new message, or None when `prev` (an assistant message) took it."""
    assistant = prev if prev and prev.get("role") == "assistant" else None
    kind = item["kind"]
    if kind == "function_call" or (kind == "custom_tool_call" and newer):
        return _joined(assistant, "tool_calls", _call(item))
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise validation_error("Encrypted content is not supported.", parameter="input")
        content, summary = item.get("content") or [], item["summary"]
        text = content[0]["text"] if content else summary[0]["text"] if summary else ""
        return _joined(assistant, "reasoning", text)
    if kind == "reasoning_dict" and fills:
        return _joined(assistant, "reasoning", _dict_reasoning(item))
    if kind == "output_message":
        first = item["content"][0] if item["content"] else None
        if first is None and fills:
            return _joined(assistant, "content", "")
        if first is None or first.get("type") != "output_text":  # item.content[0].text: vLLM's 500
            missing = "list index out of range" if first is None else "'ResponseOutputRefusal' object has no " \
                                                                      "attribute 'text'"  # fmt: skip
            raise ApiError(missing, status=500, type="InternalServerError")
        return _joined(assistant, "content", first["text"])
    if kind == "function_call_output" or (kind == "custom_tool_call_output" and newer):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    message = item.get("message")
    if message is None:  # a reasoning dict before 0.34, too
        raise validation_error(f"Unsupported input item type: {item.get('type')}", parameter="input")
    content = message.get("content")
    if message.get("role") == "assistant" and fills:
        text = content if isinstance(content, str) else content[0].get("text", "") if content else ""
        return _joined(assistant, "content", text)
    if message.get("role") == "assistant":
        text = content if isinstance(content, str) else content[0].get("text") if content else None
        if text is not None:
            return _joined(assistant, "content", text)
    return dict(message)


def _dict_reasoning(item: Item) -> str:
    """0.34's reasoning dict: `content` when set (its first part's text, "" for none), else `summary`'s; listing a
    ValidatorIterator validates each element (a list's parts, an object's keys, a string's characters), and one
    that is not a part is pydantic's ValidationError, which vLLM answers 400 with its text."""
    key, kind = ("content", "reasoning_text") if "content" in item else ("summary", "summary_text")
    listed = list(item[key])
    for i, part in enumerate(listed):
        if not (isinstance(part, dict) and part.get("type") == kind and isinstance(part.get("text"), str)):
            raise ApiError(f"1 validation error for ValidatorIterator\n{i}\n  Input should be a valid {kind} part "
                           f"[input_value={part!r}]")  # fmt: skip
    return str(listed[0]["text"]) if listed else ""


def _call(item: Item) -> dict[str, Any]:
    if item["kind"] == "custom_tool_call":  # encode_custom_tool_input
        name, arguments = item["name"], json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    else:
        name, arguments = item["name"], item["arguments"]
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
    return {"id": item["call_id"], "function": {"name": name, "arguments": arguments}, "type": "function"}


def _joined(assistant: dict[str, Any] | None, key: str, value: Any) -> dict[str, Any] | None:
    """The value set on the previous assistant message while its `key` is unset (tool calls appended to a list);
    else a new assistant message."""
    if assistant is not None and key == "tool_calls" and isinstance(assistant.get(key), list):
        assistant[key].append(value)
        return None
    if assistant is not None and assistant.get(key) is None:
        assistant[key] = [value] if key == "tool_calls" else value
        return None
    return {"role": "assistant", key: [value] if key == "tool_calls" else value}
