"""A Responses create for a gpt-oss model as vLLM renders it: harmony messages, not chat messages (vLLM 0.31/0.32
`renderers/online_renderer.py` _render_responses_with_harmony, `responses/harmony.py` response_input_to_harmony and
harmony_to_response_output, `responses/serving.py` msg_store; the same in both versions). vLLM 0.34 reads the items
after its OpenResponses normalisation (`fills`, as counting/responses.py does) and renders a reasoning item without
content as an empty assistant message, where 0.31-0.33 render nothing for it.

    a new conversation    the preamble (a system message with the reasoning effort; a developer message with the
                          instructions, or a leading system/developer input message's, and the function tools), then
                          one harmony message per input item
    previous_response_id  the stored messages of that response as they are, then one message per input item: the new
                          request's instructions, tools and reasoning effort are not rendered (no preamble is built)

What vLLM stores for a response is every message it rendered for it (the previous turn's included) followed by the
messages it parsed from the generated tokens. The guard rebuilds the latter from the response's output items:
reasoning -> analysis, message -> final, function_call -> commentary to `functions.<name>`. vLLM renders analysis
before the last final answer nowhere (auto_drop_analysis_messages), so a stored history keeps none of it.

Messages are kept as openai_harmony's `Message.to_dict()` shapes (plain JSON, for the ledger); counting/harmony.py
renders them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.responses import ResponsesRequest
from proxy.counting.harmony import EFFORTS, HOSTED_TOOLS, HarmonyChat, flatten
from proxy.counting.responses import responses_chat
from proxy.errors import InvalidRequest

Messages = list[dict[str, Any]]
CALL_CONTENT_TYPE = "<|constrain|>json"  # what the parser reads from a call gpt-oss writes (`<|constrain|>json`)


@dataclass(frozen=True, slots=True)
class HarmonyHistory:
    """What vLLM holds for a stored response of a gpt-oss model: its messages (msg_store), and the function calls
    of its output by call id (a next turn's function_call_output is looked up among them)."""

    messages: Messages
    calls: dict[str, str]

    def encode(self) -> dict[str, Any]:
        return {"harmony": self.messages, "calls": self.calls}

    @staticmethod
    def decode(raw: Any) -> HarmonyHistory | None:
        if not isinstance(raw, dict):
            return None
        messages, calls = raw.get("harmony"), raw.get("calls")
        if not isinstance(messages, list) or not isinstance(calls, dict):
            return None
        return HarmonyHistory(messages, calls)


def harmony_chat(
    native: HarmonyChat, req: ResponsesRequest, newer: bool, stored: HarmonyHistory | None,
    effort_map: Mapping[str, str] | None = None, fills: bool = False,
) -> ChatRequest:  # fmt: skip
    """The chat request for `req` (its checks and the body an upstream count reads), holding the harmony messages
    vLLM renders for it; `stored`: the response its previous_response_id continues (None: a new conversation);
    `effort_map`: the server's --reasoning-effort-map; `fills`: vLLM 0.34+'s reading of the input items."""
    chat = responses_chat(req, newer, fills=fills)  # vLLM's checks of the request and its items, before rendering
    return replace(chat, harmony=harmony_messages(native, req, stored, effort_map, fills))


def harmony_messages(
    native: HarmonyChat, req: ResponsesRequest, stored: HarmonyHistory | None,
    effort_map: Mapping[str, str] | None = None, fills: bool = False,
) -> Messages:  # fmt: skip
    items: str | list[dict[str, Any]] = req.input
    if stored is not None:
        messages = [dict(m) for m in stored.messages]
        calls = dict(stored.calls)
    else:
        instructions = req.instructions
        if instructions is None and isinstance(items, list):
            instructions, items = _leading_instructions(items)
        messages, calls = _preamble(native, req, instructions, effort_map or {}), {}
    if isinstance(items, str):
        return [*messages, _text("user", items)]
    for item in items:
        message = _from_item(native, item, calls, fills)
        if message is not None:
            messages.append(message)
        if item.get("type") == "function_call":
            calls[item["call_id"]] = item["name"]
    return messages


def harmony_after(messages: Messages | None, output: Any) -> HarmonyHistory | None:
    """What vLLM stores for a response: the messages rendered for it, then its output items as the harmony messages
    it parsed them from; None when either is not known or an item is not one the guard can rebuild exactly."""
    if messages is None or not isinstance(output, list):
        return None
    rebuilt, calls = [], {}
    for item in output:  # a function_call's name and arguments are strings (_from_output)
        message = _from_output(item) if isinstance(item, dict) else None
        if message is None:
            return None
        rebuilt.append(message)
        if message.get("recipient") is not None and isinstance(item.get("call_id"), str):
            calls[item["call_id"]] = item["name"]
    return HarmonyHistory(_without_stale_analysis(messages + rebuilt), calls)


def _preamble(
    native: HarmonyChat, req: ResponsesRequest, instructions: str | None, effort_map: Mapping[str, str]
) -> Messages:
    """build_harmony_preamble: the function tools only when some tool is not a built-in one (has_custom_tools); the
    effort as --reasoning-effort-map rewrites it (0.33+)."""
    reasoning = req.body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if isinstance(effort, str):
        effort = effort_map.get(effort, effort)
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"reasoning_effort={effort!r} is not supported by Harmony. Supported values are: "
                             "high, medium, low.", param="reasoning_effort")  # fmt: skip
    tools = req.tools or []
    kinds = {t.get("type") for t in tools if isinstance(t, dict) and t.get("type") != "mcp"}
    custom = not kinds <= set(HOSTED_TOOLS)
    chat_tools = [_chat_tool(t) for t in tools] if custom else None
    return native.preamble_dicts(instructions, chat_tools, effort)


def _chat_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return {"type": tool.get("type") if isinstance(tool, dict) else None}  # a built-in, or one harmony refuses
    function = {"name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("parameters")}
    return {"type": "function", "function": function}


def _leading_instructions(items: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """extract_instructions_from_messages: a leading system or developer message is the instructions."""
    if not items or items[0].get("role") not in ("system", "developer"):
        return None, items
    return flatten(items[0].get("content")), items[1:]


def _from_item(native: HarmonyChat, item: dict[str, Any], calls: dict[str, str], fills: bool) -> dict[str, Any] | None:
    """response_input_to_harmony: one input item as a harmony message (None: nothing rendered for it). An item
    without a type reaches it only with a role (responses_chat refuses any other, as pydantic does before it)."""
    kind = item.get("type")
    if kind is None or kind == "message":
        role, content = item.get("role"), item.get("content")
        if role in ("system", "developer"):
            text = flatten(content)
            return native.instructions_dict(role, text) if text else None
        message = _text(role, content) if isinstance(content, str) else _texts(role, content)
        return {**message, "channel": "final"} if role == "assistant" else message
    if kind == "function_call_output":
        name = calls.get(str(item.get("call_id")))
        if name is None:
            raise InvalidRequest(f"No call message found for {item.get('call_id')}", param="input")
        output = item.get("output")
        if not isinstance(output, str):
            raise InvalidRequest("A function_call_output's output must be a string for this model.", param="input")
        return {"role": "tool", "name": f"functions.{name}", "content": [{"type": "text", "text": output}],
                "channel": "commentary", "recipient": "assistant"}  # fmt: skip
    if kind == "reasoning":
        parts = item.get("content")
        if not parts:  # the summary is never rendered: 0.31-0.33 skip the item, 0.34 keeps its place
            return _text("assistant", "") if fills else None
        return {**_text("assistant", "\n".join(p["text"] for p in parts)), "channel": "analysis"}  # checked
    if kind == "function_call":
        return _call(item.get("name"), item.get("arguments"), "json")
    raise InvalidRequest(f"Unknown input type: {kind}", param="input")


def _from_output(item: dict[str, Any]) -> dict[str, Any] | None:
    """harmony_to_response_output read backwards, for the items a gpt-oss answer without built-in tools holds."""
    kind, parts = item.get("type"), item.get("content")
    if kind == "reasoning" and isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict):
        return {**_text("assistant", str(parts[0].get("text", ""))), "channel": "analysis"}
    if kind == "message" and isinstance(parts, list) and all(isinstance(p, dict) for p in parts):
        if any(not isinstance(p.get("text"), str) for p in parts):
            return None  # a refusal part: not something the parser writes
        return {**_texts("assistant", parts), "channel": "final"}
    if kind == "function_call" and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), str):
        return _call(item["name"], item["arguments"], CALL_CONTENT_TYPE)
    return None


def _call(name: Any, arguments: Any, content_type: str) -> dict[str, Any]:
    return {**_text("assistant", arguments if isinstance(arguments, str) else json.dumps(arguments)),
            "channel": "commentary", "recipient": f"functions.{name}", "content_type": content_type}  # fmt: skip


def _text(role: Any, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _texts(role: Any, parts: Any) -> dict[str, Any]:
    texts = [p.get("text", "") if isinstance(p, dict) else "" for p in parts or []]
    return {"role": role, "content": [{"type": "text", "text": t} for t in texts]}


def _without_stale_analysis(messages: Messages) -> Messages:
    """auto_drop_analysis_messages, done once at recording: no later turn renders analysis before the last final
    answer it holds, and a continuation only adds messages after it."""
    finals = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("channel") == "final"]
    last = finals[-1] if finals else -1
    return [m for i, m in enumerate(messages) if not (i < last and m.get("channel") == "analysis")]
