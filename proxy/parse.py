"""Read the fields the guard needs from a chat or completions body, and rewrite a body with changed fields.

Only the fields that change the count or the clamp are read and type-checked; every other field stays in `body`
untouched, so unknown and future client fields pass through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

MAX_DEPTH = ServerSettings.max_json_depth
MAX_MESSAGES = ServerSettings.max_messages


@dataclass(frozen=True)
class ChatRequest:
    body: dict[str, Any]
    model: str | None
    messages: list[Any]
    tools: list[Any] | None
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool
    chat_template: str | None
    chat_template_kwargs: dict[str, Any]
    max_tokens: int | None
    max_completion_tokens: int | None
    min_tokens: int | None
    n: int
    stream: bool

    @property
    def requested_output(self) -> tuple[str, int] | None:
        """The field vLLM takes the output limit from, and its value (max_completion_tokens wins)."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        if self.max_tokens is not None:
            return "max_tokens", self.max_tokens
        return None


@dataclass(frozen=True)
class CompletionRequest:
    body: dict[str, Any]
    model: str | None
    prompts: list[str | list[int]]
    add_special_tokens: bool
    max_tokens: int | None
    min_tokens: int | None
    n: int
    stream: bool

    @property
    def requested_output(self) -> tuple[str, int]:
        return "max_tokens", 16 if self.max_tokens is None else self.max_tokens


def parse_json_object(raw: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    check_depth(raw, max_depth)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply to be read.") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {_kind(body)}.")
    return body


_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


def check_depth(raw: bytes, max_depth: int) -> None:
    """A 400 for arrays and objects nested deeper than `max_depth`, before json.loads builds (or recurses into)
    anything. Only C-speed bytes operations: drop the strings, keep the brackets, then drop the innermost `[]` pairs
    once per level; a body nested d deep is empty after d passes."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # after this, every `"` opens or closes a string
    shape = b"".join(unescaped.split(b'"')[::2]).translate(_SQUARE, _NOT_BRACKET)
    too_deep = b"[" * (max_depth + 1)
    for level in range(max_depth):
        if level < 2 and too_deep in shape:  # the plain nesting bomb, with or without leaves, ends here at once
            break
        shorter = shape.replace(b"[]", b"")
        if len(shorter) == len(shape):
            return  # no pairs left: shallow enough (or not JSON, which json.loads will say)
        shape = shorter
    if b"[]" in shape or too_deep in shape:
        raise InvalidRequest(
            f"The request body is nested too deeply: more than {max_depth} levels (server.max_json_depth)."
        )


def parse_chat(raw: bytes, max_messages: int = MAX_MESSAGES, max_depth: int = MAX_DEPTH) -> ChatRequest:
    body = parse_json_object(raw, max_depth)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array of message objects.", param="messages")
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"'messages' has {len(messages)} messages; at most {max_messages} are accepted (server.max_messages).",
            param="messages",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string 'role'.", param="messages")
    tools = _optional(body, "tools", list, "an array")
    kwargs = _optional(body, "chat_template_kwargs", dict, "an object") or {}
    add_generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final_message = _flag(body, "continue_final_message", False)
    if continue_final_message and add_generation_prompt:
        # vLLM answers 400 here too (transformers refuses to render this combination).
        raise InvalidRequest(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True "
            "(add_generation_prompt defaults to true: send false with continue_final_message).",
            param="continue_final_message",
        )
    return ChatRequest(
        body=body,
        model=_model(body),
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        add_special_tokens=_flag(body, "add_special_tokens", False),
        chat_template=_optional(body, "chat_template", str, "a string"),
        chat_template_kwargs=kwargs,
        max_tokens=_count(body, "max_tokens"),
        max_completion_tokens=_count(body, "max_completion_tokens"),
        min_tokens=_count(body, "min_tokens"),
        n=_choices(body),
        stream=_flag(body, "stream", False),
    )


def parse_completion(raw: bytes, max_depth: int = MAX_DEPTH) -> CompletionRequest:
    body = parse_json_object(raw, max_depth)
    return CompletionRequest(
        body=body,
        model=_model(body),
        prompts=_prompts(body.get("prompt")),
        add_special_tokens=_flag(body, "add_special_tokens", True),
        max_tokens=_count(body, "max_tokens"),
        min_tokens=_count(body, "min_tokens"),
        n=_choices(body),
        stream=_flag(body, "stream", False),
    )


def _prompts(prompt: Any) -> list[str | list[int]]:
    expected = "'prompt' must be a string, an array of strings, an array of token ids, or an array of those."
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        raise InvalidRequest(expected, param="prompt")
    if not prompt or prompt == [[]]:
        raise InvalidRequest("please provide at least one prompt", param="prompt")
    if all(_is_token(t) for t in prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in prompt):
        return list(prompt)
    raise InvalidRequest(expected + " Strings and token ids cannot be mixed.", param="prompt")


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a string, got {_kind(model)}.", param="model")
    return model or None


def _count(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{key}' must be an integer, got {_kind(value)}.", param=key)
    if value < 0:
        raise InvalidRequest(f"'{key}' must be at least 0, got {value}.", param=key)
    return value


def _choices(body: dict[str, Any]) -> int:
    n = _count(body, "n")
    if n == 0:
        raise InvalidRequest("'n' must be at least 1, got 0.", param="n")
    return 1 if n is None else n


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be a boolean, got {_kind(value)}.", param=key)
    return value


def _optional(body: dict[str, Any], key: str, kind: type, expected: str) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequest(f"'{key}' must be {expected}, got {_kind(value)}.", param=key)
    return value


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def with_changes(body: dict[str, Any], changes: dict[str, int]) -> bytes:
    """The body re-serialized with only `changes` applied; key order and every other value are kept."""
    return json.dumps({**body, **changes}, ensure_ascii=False, separators=(",", ":")).encode()
