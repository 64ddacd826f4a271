"""A gpt-oss model's Responses prompt, as vLLM 0.31-0.34 build it (model_type `gpt_oss` in config.json): harmony
messages built with openai_harmony from the request, or from what the store holds for the response it continues,
then rendered for completion (renderers/online_renderer.py _render_responses_with_harmony, responses/harmony.py
response_input_to_harmony, parser/harmony_utils.py build_harmony_preamble and render_for_completion).

Written from vLLM's source, apart from the guard's conversion (counting/harmony_responses.py); only the last step,
render_for_completion, is the guard's (counting/harmony.py), as the chat conversions are elsewhere in the simulator.
The simulator's answer is the model's final channel: what the store keeps after the rendered messages."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from proxy.counting.harmony import HarmonyChat
from proxy.errors import GuardError
from simulator.errors import ApiError

BUILT_IN = {"web_search_preview", "code_interpreter", "container"}
EFFORTS = ("low", "medium", "high")


def is_harmony(model_dir: Path) -> bool:
    """vLLM's choice: the model's config.json says model_type gpt_oss."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "gpt_oss"


class SimHarmony:
    def __init__(self, keeps_empty_reasoning: bool = False) -> None:
        """`keeps_empty_reasoning`: the profile's (0.34's response_input_to_harmony)."""
        import openai_harmony as oh

        self.oh, self._chat, self.keeps_empty_reasoning = oh, HarmonyChat(), keeps_empty_reasoning

    def prompt(self, body: dict[str, Any], stored: list[Any] | None, outputs: list[dict[str, Any]]) -> list[Any]:
        """The messages rendered for `body`; `stored`: the messages kept for the response it continues, whose output
        items are `outputs`."""
        items = body.get("input")
        messages = list(stored) if stored is not None else self._preamble(body)
        calls = [o for o in outputs if o.get("type") == "function_call"]
        if isinstance(items, str):
            return [*messages, self.oh.Message.from_role_and_content(self.oh.Role.USER, items)]
        if stored is None and body.get("instructions") is None and items and items[0].get("role") in (
            "system", "developer"):  # fmt: skip
            items = items[1:]  # the instructions (extract_instructions_from_messages)
        for item in items or []:
            message = self._item(item, calls)
            if message is not None:
                messages.append(message)
            if item.get("type") == "function_call":
                calls.append(item)
        return messages

    def render(self, messages: list[Any]) -> list[int]:
        try:
            return self._chat.render_messages(messages)
        except GuardError as exc:
            raise ApiError(exc.message) from None

    def answered(self, messages: list[Any], output: list[dict[str, Any]]) -> list[Any]:
        """What vLLM's msg_store holds once the answer is parsed: each output message as a final-channel message."""
        oh, answer = self.oh, []
        for item in output:
            texts = [oh.TextContent(text=p.get("text", "")) for p in item.get("content") or []]
            answer.append(oh.Message.from_role_and_contents(oh.Role.ASSISTANT, texts).with_channel("final"))
        return [*messages, *answer]

    def _preamble(self, body: dict[str, Any]) -> list[Any]:
        oh = self.oh
        instructions, items = body.get("instructions"), body.get("input")
        if instructions is None and isinstance(items, list) and items and items[0].get("role") in (
            "system", "developer"):  # fmt: skip
            instructions = _flat(items[0].get("content"))
        effort = (body.get("reasoning") or {}).get("effort")
        system = oh.SystemContent.new()
        if effort is not None:
            if effort not in EFFORTS:
                raise ApiError(f"reasoning_effort={effort!r} is not supported by Harmony. Supported values are: "
                               "high, medium, low.", param="reasoning_effort")  # fmt: skip
            system = system.with_reasoning_effort(oh.ReasoningEffort[effort.upper()])
        system = system.with_conversation_start_date(datetime.date.today().isoformat())
        messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
        tools = body.get("tools") or []
        custom = {t.get("type") for t in tools if t.get("type") != "mcp"} - BUILT_IN
        if instructions or (tools and custom):
            developer = oh.DeveloperContent.new()
            if instructions is not None:
                developer = developer.with_instructions(instructions)
            functions = [oh.ToolDescription.new(t["name"], t.get("description") or "", t.get("parameters"))
                         for t in tools if custom and t.get("type") == "function"]  # fmt: skip
            if functions:
                developer = developer.with_function_tools(functions)
            messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
        return messages

    def _item(self, item: dict[str, Any], calls: list[dict[str, Any]]) -> Any:
        oh, kind = self.oh, item.get("type")
        if kind is None:  # 0.34: by its role, or its summary; 0.31-0.33: a message
            untyped = "message" if "role" in item else "reasoning" if "summary" in item else None
            kind = untyped if self.keeps_empty_reasoning else "message"
        if kind == "message":
            role, content = item["role"], item.get("content")
            if role in ("system", "developer"):
                text = _flat(content)
                instructions = oh.DeveloperContent.new().with_instructions(text) if text else None
                return oh.Message.from_role_and_content(oh.Role.DEVELOPER, instructions) if instructions else None
            if isinstance(content, str):
                message = oh.Message.from_role_and_content(role, content)
            else:
                message = oh.Message.from_role_and_contents(role, [oh.TextContent(text=c.get("text", ""))
                                                                   for c in content or []])  # fmt: skip
            return message.with_channel("final") if role == "assistant" else message
        if kind == "function_call_output":
            found = [c for c in calls if c.get("call_id") == item.get("call_id")]
            if not found:
                raise ApiError(f"No call message found for {item.get('call_id')}", param="input")
            author = oh.Author.new(oh.Role.TOOL, f"functions.{found[-1]['name']}")
            return oh.Message.from_author_and_content(author, item["output"]).with_channel("commentary") \
                .with_recipient("assistant")  # fmt: skip
        if kind == "reasoning":
            content = item.get("content")
            if content:
                text = "\n".join(c["text"] for c in content)
                return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("analysis")
            # no content: 0.34 keeps the item's place in the conversation, 0.31-0.33 skip it
            return oh.Message.from_role_and_content(oh.Role.ASSISTANT, "") if self.keeps_empty_reasoning else None
        if kind == "function_call":
            return oh.Message.from_role_and_content(oh.Role.ASSISTANT, item["arguments"]).with_channel("commentary") \
                .with_recipient(f"functions.{item['name']}").with_content_type("json")  # fmt: skip
        raise ApiError(f"Unknown input type: {kind}", param="input")


def _flat(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = [c if isinstance(c, str) else c.get("text") for c in content if isinstance(c, str | dict)]
    return "".join(t for t in texts if t is not None) if texts else None
