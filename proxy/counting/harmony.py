"""Counting chat for gpt-oss models: vLLM renders their chat with openai_harmony, not with the Jinja template, and
ignores `chat_template`, `chat_template_kwargs`, `add_generation_prompt` and `continue_final_message` for them
(vLLM 0.31/0.32 `entrypoints/openai/parser/harmony_utils.py`, the same in both).

Only a leading system or developer message becomes the instructions; later ones are developer messages of their own.
Tool results are authored by `functions.<name of the call with that id>`; assistant reasoning goes to the analysis
channel, and analysis before the last final answer is dropped. vLLM then rewrites tool-call headers to their legacy
form (`assistant to=functions.x<|channel|>commentary json`), which changes the count. Completions are plain
tokenization with the Hugging Face tokenizer, as for any model.

openai_harmony's errors become the guard's 400 here, at this module's boundary.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.counting.conversation import MEDIA_PART_TYPES
from proxy.errors import CountedUpstreamOnly, InvalidRequest

EFFORTS = ("high", "medium", "low")
HOSTED_TOOLS = ("web_search_preview", "code_interpreter", "container")


class HarmonyLoadError(ValueError):
    pass


class HarmonyChat:
    def __init__(self, system_instructions: bool = False) -> None:
        """`system_instructions`: vLLM's VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS (instructions in the system
        message's model identity instead of a developer message)."""
        try:
            import openai_harmony as oh

            self._enc = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
        except ImportError as exc:
            raise HarmonyLoadError("gpt-oss models need the oss-harmony (or openai-harmony) package") from exc
        except Exception as exc:  # openai-harmony <= 0.0.8 downloads its vocabulary, and fails offline
            raise HarmonyLoadError(
                f"openai_harmony could not load its vocabulary ({exc}); offline, point TIKTOKEN_ENCODINGS_BASE at a "
                "folder holding o200k_base.tiktoken, or install oss-harmony, which ships it"
            ) from exc
        self._oh = oh
        self.system_instructions = system_instructions
        self._start, self._channel, self._constrain, self._message = (
            self._enc.encode(t, allowed_special="all")[0]
            for t in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
        )

    def chat_ids(
        self, req: ChatRequest, request_kwargs: bool = False, defaults: Mapping[str, Any] | None = None
    ) -> list[int]:
        # vLLM renders gpt-oss with openai_harmony, which no chat-template kwarg reaches
        try:
            return self.render_dicts(req.harmony) if req.harmony is not None else self.render(req)
        except InvalidRequest:
            raise
        except Exception as exc:  # harmony refuses structures it cannot render
            raise InvalidRequest(f"{type(exc).__name__}: {exc}", param="messages") from None

    def text_ids(self, text: str, add_special_tokens: bool) -> None:
        return None  # completions: the Hugging Face tokenizer, as vLLM does

    def render(self, req: ChatRequest) -> list[int]:
        effort = req.body.get("reasoning_effort")
        if effort == "none":
            raise InvalidRequest("Harmony does not support reasoning_effort='none'", param="reasoning_effort")
        if effort is not None and effort not in EFFORTS:
            raise InvalidRequest(f"reasoning_effort={effort!r} is not supported by Harmony. Supported values are: "
                                 "high, medium, low.", param="reasoning_effort")  # fmt: skip
        messages = [m for m in req.messages if isinstance(m, dict)]
        instructions, rest = None, messages
        if messages and messages[0].get("role") in ("system", "developer"):
            instructions, rest = flatten(messages[0].get("content")), messages[1:]
        harmony = self._preamble(instructions, req.tools, effort) + self._messages(rest)
        return self._render(harmony)

    def render_dicts(self, messages: list[dict[str, Any]]) -> list[int]:
        """Harmony messages as `Message.to_dict()` shapes (a Responses create: harmony_responses.py), rendered."""
        return self.render_messages([self._oh.Message.from_dict(m) for m in messages])

    def render_messages(self, messages: list[Any]) -> list[int]:
        """vLLM's render_for_completion of openai_harmony messages."""
        try:
            return self._render(messages)
        except Exception as exc:  # harmony refuses structures it cannot render
            raise InvalidRequest(f"{type(exc).__name__}: {exc}", param="input") from None

    def preamble_dicts(self, instructions: str | None, tools: list[Any] | None, effort: str | None) -> list[Any]:
        return [_as_dict(m) for m in self._preamble(instructions, tools, effort)]

    def instructions_dict(self, role: str, text: str) -> dict[str, Any]:
        """get_system_or_developer_message: a system or developer message of a conversation's input."""
        system = role == "system" and self.system_instructions
        return _as_dict(self._system(None, text) if system else self._developer(text, None))

    def _system(self, effort: str | None, instructions: str | None = None) -> Any:
        oh = self._oh
        content = oh.SystemContent.new()
        if instructions is not None and self.system_instructions:
            identity = content.model_identity
            content = content.with_model_identity(f"{identity}\n{instructions}" if identity else instructions)
        if effort is not None:
            levels = {
                "high": oh.ReasoningEffort.HIGH,
                "medium": oh.ReasoningEffort.MEDIUM,
                "low": oh.ReasoningEffort.LOW,
            }
            content = content.with_reasoning_effort(levels[effort])
        # The date is part of the prompt, but every date is the same number of tokens.
        content = content.with_conversation_start_date(datetime.date.today().isoformat())
        return oh.Message.from_role_and_content(oh.Role.SYSTEM, content)

    def _developer(self, instructions: str | None, tools: list[Any] | None) -> Any:
        oh = self._oh
        content = oh.DeveloperContent.new()
        if instructions is not None and not self.system_instructions:
            content = content.with_instructions(instructions)
        functions = []
        for tool in tools or []:
            kind = tool.get("type", "function") if isinstance(tool, dict) else None
            if kind in HOSTED_TOOLS:
                continue
            function = tool.get("function") if isinstance(tool, dict) and kind == "function" else None
            if not isinstance(function, dict):
                raise InvalidRequest(f"tool type {kind!r} is not supported.", param="tools")
            description = function.get("description") or ""
            functions.append(oh.ToolDescription.new(function.get("name"), description, function.get("parameters")))
        if functions:
            content = content.with_function_tools(functions)
        return oh.Message.from_role_and_content(oh.Role.DEVELOPER, content)

    def _preamble(self, instructions: str | None, tools: list[Any] | None, effort: str | None) -> list[Any]:
        preamble = [self._system(effort, instructions if self.system_instructions else None)]
        developer_instructions = None if self.system_instructions else instructions
        if developer_instructions or tools:
            preamble.append(self._developer(developer_instructions, tools))
        return preamble

    def _messages(self, messages: list[dict[str, Any]]) -> list[Any]:
        names = {}
        for m in messages:
            for call in m.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    names[call.get("id")] = call["function"].get("name")
        return [out for m in messages for out in self._convert(m, names)]

    def _convert(self, m: dict[str, Any], names: dict[Any, Any]) -> list[Any]:
        oh, role = self._oh, m.get("role")
        reasoning = m.get("reasoning") if m.get("reasoning") is not None else m.get("reasoning_content")
        calls = m.get("tool_calls") or []
        if role == "assistant" and calls:
            out = []
            content = flatten(m.get("content"))
            if content:
                out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, content).with_channel("commentary"))
            if reasoning:
                out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, reasoning).with_channel("analysis"))
            for call in calls:
                function = call.get("function", {}) if isinstance(call, dict) else {}
                out.append(
                    oh.Message.from_role_and_content(oh.Role.ASSISTANT, function.get("arguments", "") or "")
                    .with_channel("commentary").with_recipient(f"functions.{function.get('name', '')}")
                    .with_content_type("json")
                )  # fmt: skip
            return out
        if role == "tool":
            author = oh.Author.new(oh.Role.TOOL, f"functions.{names.get(m.get('tool_call_id', ''), '') or ''}")
            message = oh.Message.from_author_and_content(author, flatten(m.get("content")) or "")
            return [message.with_channel("commentary").with_recipient("assistant")]
        out = []
        if role == "assistant" and reasoning:
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, reasoning).with_channel("analysis"))
        texts = _texts(m.get("content"))
        if role == "assistant":
            if texts and texts[0].text:
                out.append(oh.Message.from_role_and_contents(oh.Role.ASSISTANT, texts).with_channel("final"))
        elif role in ("system", "developer"):
            instructions = flatten(m.get("content"))
            if instructions is not None:
                if role == "system" and self.system_instructions:
                    out.append(self._system(None, instructions))
                else:
                    out.append(self._developer(instructions, None))
        else:
            out.append(oh.Message.from_role_and_contents(role, texts))
        return out

    def _render(self, messages: list[Any]) -> list[int]:
        oh = self._oh
        finals = [i for i, m in enumerate(messages) if m.author.role == oh.Role.ASSISTANT and m.channel == "final"]
        last_final = finals[-1] if finals else -1
        kept = [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]
        ids = self._enc.render_conversation_for_completion(
            oh.Conversation.from_messages(kept), oh.Role.ASSISTANT,
            config=oh.RenderConversationConfig(auto_drop_analysis=False),
        )  # fmt: skip
        return self._legacy_headers(list(ids))

    def _legacy_headers(self, ids: list[int]) -> list[int]:
        """vLLM's _use_legacy_tool_call_headers: `<|start|>assistant<|channel|>commentary to=functions.x
        <|constrain|>json<|message|>` becomes `<|start|>assistant to=functions.x<|channel|>commentary json
        <|message|>`."""
        enc, out, i = self._enc, ids, 0
        while i < len(out):
            if out[i] != self._start:
                i += 1
                continue
            try:
                end = out.index(self._message, i + 1)
                channel = out.index(self._channel, i + 1, end)
                constrain = out.index(self._constrain, channel + 1, end)
            except ValueError:
                i += 1
                continue
            author = enc.decode(out[i + 1 : channel])
            header = enc.decode(out[channel + 1 : constrain])
            kind = enc.decode(out[constrain + 1 : end])
            if author != "assistant" or " to=" not in header or not header.endswith(" "):
                i = end + 1
                continue
            name, recipient = header[:-1].split(" to=", 1)
            if not name or not recipient or not kind:
                i = end + 1
                continue
            legacy = [self._start, *enc.encode(f"assistant to={recipient}"), self._channel,
                      *enc.encode(f"{name} {kind}"), self._message]  # fmt: skip
            out[i : end + 1] = legacy
            i += len(legacy)
        return out


def _as_dict(message: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(message.to_json())
    return loaded


def flatten(content: Any) -> str | None:
    """List content joined with no separator, as vLLM's flatten_input_text_content does."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [p if isinstance(p, str) else p.get("text") for p in content if _text_part(p)]
    return "".join(t for t in texts if isinstance(t, str)) if texts else None


def _texts(content: Any) -> list[Any]:
    from openai_harmony import TextContent

    if content is None:
        return [TextContent(text="")]
    if isinstance(content, str):
        return [TextContent(text=content)]
    return [TextContent(text=p.get("text", "") if isinstance(p, dict) else p) for p in content if _text_part(p)]


def _text_part(part: Any) -> bool:
    if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
        kind = part.get("type")
        raise CountedUpstreamOnly(f"a {kind} part: its tokens depend on the model's processor", param="messages")
    return isinstance(part, str) or (isinstance(part, dict) and part.get("text") is not None)
