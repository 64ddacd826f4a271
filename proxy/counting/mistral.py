"""Counting for models vLLM serves with `--tokenizer-mode mistral`: chat is rendered by mistral_common straight to
token ids, with no chat template and no text step (vLLM 0.31/0.32 `renderers/mistral.py`, `tokenizers/mistral.py`).

Before mistral_common sees a chat request, vLLM gives every assistant message a `tool_calls` list, keeps the last 9
characters of longer tool-call ids, refuses any `chat_template` or `chat_template_kwargs`, and (as a side effect of
parsing the messages) turns tool-call arguments into objects, which mistral_common then dumps again with spaces.
mistral_common itself maps developer to system, puts system prompts before the last user turn, joins text parts with
a blank line and re-dumps JSON tool results. Completions: `Tekkenizer.encode(text, bos=add_special_tokens)`, where
control-token text such as "[INST]" stays plain text.

What of the request reaches mistral_common besides the messages changed in 0.34: up to 0.33 only `reasoning_effort`,
and only for a v15+ tokenizer; 0.34 hands it every remaining kwarg (`tokenizers/mistral.py`), so `reasoning_effort`
whatever the version (a pre-v15 tokenizer refuses it), and `response_format` when it is `json_object` or a
`json_schema` with a schema (`renderers/mistral.py`): a v15+ tokenizer whose file configures a `json_schema` model
setting writes that schema into the prompt ("[MODEL_SETTINGS]{"json_schema": ...}[/MODEL_SETTINGS]"); older ones
only validate it.

The server's --default-chat-template-kwargs sit under what the request sets (vLLM's `with_defaults`; a None or
"auto" request value leaves the default): on every release a default `reasoning_effort` reaches mistral_common as the
request's would (up to 0.33 only for v15+), and a default `tools` list serves a request without tools; from 0.34 every
other default but the few vLLM's MistralTokenizer reads itself reaches `ChatCompletionRequest.from_openai`, a
`response_format` among them when the request hands over none of its own. add_generation_prompt and
continue_final_message never come from the defaults: every request sets both.

mistral_common's errors become the guard's 400 here, at this module's boundary.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proxy.api.body import json_arguments
from proxy.api.chat import ChatRequest
from proxy.counting.conversation import MEDIA_PART_TYPES, to_tools
from proxy.errors import CountedUpstreamOnly, InvalidRequest

MISTRAL_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
NONE: Mapping[str, Any] = MappingProxyType({})
# kwargs vLLM 0.34's MistralTokenizer.apply_chat_template reads itself (or drops) before handing the rest on, and
# `tools`, a parameter of its own: a server default for these never reaches ChatCompletionRequest.from_openai
_TAKEN = frozenset({"tools", "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
                    "max_length", "return_tensors", "return_dict"})  # fmt: skip


class MistralLoadError(ValueError):
    pass


def tokenizer_file(directory: Path) -> Path | None:
    """The file vLLM's mistral mode reads: tekken.json, else the newest tokenizer.model.v*."""
    if (directory / "tekken.json").is_file():
        return directory / "tekken.json"
    versions = sorted(directory.glob("tokenizer.model.v*"))
    return versions[-1] if versions else None


class MistralChat:
    """One model's mistral_common tokenizer, in the validation mode vLLM uses."""

    def __init__(self, directory: Path) -> None:
        try:
            from mistral_common.protocol.instruct.validator import ValidationMode
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        except ImportError as exc:
            raise MistralLoadError("tokenizer_mode mistral needs the mistral-common package") from exc
        path = tokenizer_file(directory)
        if path is None:
            raise MistralLoadError(f"{directory}: no tekken.json or tokenizer.model.v* for tokenizer_mode mistral")
        try:
            self._tokenizer = MistralTokenizer.from_file(str(path), mode=ValidationMode.test)
        except Exception as exc:  # mistral_common raises its own and pydantic's errors for a bad file
            raise MistralLoadError(f"{path}: not a mistral_common tokenizer ({type(exc).__name__}: {exc})") from exc
        self._raw = self._tokenizer.instruct_tokenizer.tokenizer
        self.version = int(str(self._raw.version.value).rsplit("v", 1)[-1])
        self.source = str(path)

    def chat_ids(self, req: ChatRequest, request_kwargs: bool = False, defaults: Mapping[str, Any] = NONE) -> list[int]:
        """`request_kwargs`: the upstream hands mistral_common the request's kwargs as they are (vLLM 0.34+);
        `defaults`: the server's --default-chat-template-kwargs, under what the request sets."""
        messages = _prepared(req)
        kwargs = _request_kwargs(req.body, defaults) if request_kwargs else {}
        if not request_kwargs and self.version >= 15:
            kwargs["reasoning_effort"] = _set(req.body.get("reasoning_effort"), defaults.get("reasoning_effort"))
        tools = to_tools(req.tools) if req.tools is not None else defaults.get("tools")
        try:
            return self._encode(messages, tools, req.continue_final_message, kwargs)
        except Exception as exc:  # validation and structure errors: vLLM answers 400 with their text
            raise InvalidRequest(f"{type(exc).__name__}: {exc}", param="messages") from None

    def text_ids(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._raw.encode(text, bos=add_special_tokens, eos=False)
        return ids

    def prompt_ids(self, messages: list[dict[str, Any]], reasoning_effort: str | None = None) -> list[int]:
        """The prompt of plain messages with a generation prompt, for vLLM's Messages API probes; mistral_common's
        errors pass through."""
        return self._encode(messages, None, False, {"reasoning_effort": reasoning_effort})

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """`prompt_ids` with the control tokens written out, as vLLM decodes the ids of its inline-system probe."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        text: str = self._raw.decode(self.prompt_ids(messages), special_token_policy=SpecialTokenPolicy.KEEP)
        return text

    def _encode(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, continued: bool, kwargs: dict[str, Any]
    ) -> list[int]:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        request = ChatCompletionRequest.from_openai(
            messages=messages, tools=tools, continue_final_message=continued, **kwargs
        )
        tokens: list[int] = self._tokenizer.encode_chat_completion(request).tokens
        return tokens


def _set(value: Any, default: Any) -> Any:
    """vLLM's `merge_kwargs`: the request's value, unless it is unset (None or "auto"), over the server's default."""
    return default if value is None or value == "auto" else value


def _request_kwargs(body: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """What vLLM 0.34 hands mistral_common besides messages and tools: the server's defaults but those its
    MistralTokenizer takes for itself, the request's effort over theirs, and response_format as its request model
    dumps it (None fields left out), when mistral_common accepts it: `json_object`, or a schema."""
    kwargs = {k: v for k, v in defaults.items() if k not in _TAKEN}
    kwargs["reasoning_effort"] = _set(body.get("reasoning_effort"), defaults.get("reasoning_effort"))
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return kwargs
    fmt = {k: v for k, v in fmt.items() if v is not None}
    if isinstance(fmt.get("json_schema"), dict):
        fmt["json_schema"] = {k: v for k, v in fmt["json_schema"].items() if v is not None}
    schema = fmt.get("json_schema")
    if fmt.get("type") == "json_object" or (isinstance(schema, dict) and "schema" in schema):
        kwargs["response_format"] = fmt
    return kwargs


def _prepared(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as vLLM hands them to mistral_common, with vLLM's own 400s for what it refuses."""
    body = req.body
    if body.get("chat_template") is not None or body.get("chat_template_kwargs") is not None:
        raise InvalidRequest("chat_template is not supported for Mistral tokenizers.", param="chat_template")
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidRequest("Cannot set both `add_generation_prompt` and `continue_final_message` to True.",
                             param="continue_final_message")  # fmt: skip
    messages: list[dict[str, Any]] = copy.deepcopy(req.messages)
    last = messages[-1].get("role")
    if req.add_generation_prompt and last == "assistant":
        raise InvalidRequest(
            "Cannot set `add_generation_prompt` to True when the last message is from the assistant. Consider using "
            "`continue_final_message` instead.",
            param="messages",
        )
    if req.continue_final_message and last != "assistant":
        raise InvalidRequest("Cannot set `continue_final_message` to True when the last message is not from the "
                             "assistant.", param="messages")  # fmt: skip
    for m in messages:
        reasoning = m.pop("reasoning_content", None)
        if reasoning is not None and m.get("reasoning") is None:
            m["reasoning"] = reasoning
        if m.get("role") == "assistant":
            m["tool_calls"] = [_call(c) for c in m.get("tool_calls") or []]
        elif m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
            m["tool_call_id"] = m["tool_call_id"][-9:]
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = [_part(p) for p in content if not isinstance(p, dict) or p.get("type")]
    return messages


def _call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    if isinstance(call.get("id"), str):
        call["id"] = call["id"][-9:]
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise InvalidRequest("chat completions only support assistant tool_calls of type 'function'.")
    call["function"] = {**function, "arguments": _arguments(function.get("arguments"))}
    return call


def _arguments(arguments: Any) -> dict[str, Any]:
    # vLLM parses the arguments in place while building its own conversation: a JSON object string becomes the
    # object, anything else {}; mistral_common then dumps it again (a compact string gains spaces).
    if isinstance(arguments, dict):
        return arguments
    if not arguments or not isinstance(arguments, str):
        return {}
    parsed = json_arguments(arguments)
    return parsed if isinstance(parsed, dict) else {}


def _part(part: Any) -> Any:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in MEDIA_PART_TYPES:
        raise CountedUpstreamOnly(f"a {kind} part: its tokens depend on the model's processor", param="messages")
    if isinstance(part, dict) and kind not in MISTRAL_TEXT_PARTS:
        raise InvalidRequest(f"content part type {kind!r} is not supported", param="messages")
    return part
