"""The requests `token-guard doctor` counts on both sides: a built-in set covering each thing a template or tokenizer
can render differently, and the lines of a user's JSONL file (one chat or completions request object a line)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.errors import InvalidRequest


class SamplesError(ValueError):
    """A samples file that cannot be read, or a line that is not a request object."""


@dataclass(frozen=True)
class Sample:
    name: str
    kind: str  # "chat" or "completion"; a completion sample holds exactly one string prompt
    body: dict[str, Any]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _chat(name: str, *messages: dict[str, Any], **fields: Any) -> Sample:
    return Sample(name, "chat", {"messages": list(messages), **fields})


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


BUILTIN_SAMPLES: tuple[Sample, ...] = (
    _chat("plain", _user("Hello!")),
    _chat("system", {"role": "system", "content": "You are a terse assistant."}, _user("Capital of France?")),
    _chat(
        "multi-turn",
        _user("What is 2+2?"),
        {"role": "assistant", "content": "4."},
        _user("And 3+3?"),
        {"role": "assistant", "content": "6."},
        _user("Now multiply them."),
    ),
    _chat(
        "tools",
        _user("Weather in Paris?"),
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        tools=[WEATHER_TOOL],
    ),
    _chat("list-of-parts", _user([{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}])),
    _chat("cjk-emoji", _user("你好，世界！こんにちは 🌏🎌 Ünïcödé — “quotes” … 👍🏽🧑‍🤝‍🧑")),
    _chat(
        "continue-final-message",
        _user("Write a haiku about rain."),
        {"role": "assistant", "content": "Soft rain on the roof"},
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    Sample("completion", "completion", {"prompt": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"}),
    Sample("completion-cjk", "completion", {"prompt": "日本語の文章とEnglish mixed together。🎉"}),
)


def load_samples(path: Path) -> list[Sample]:
    """Every line of a JSONL file as samples named `<file>:<line>`; a batch prompt gives one sample per string.
    Token-id prompts are skipped: the upstream counts them exactly as given, so there is nothing to compare."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SamplesError(f"samples file {path}: cannot be read ({exc})") from exc
    samples: list[Sample] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                samples += _line_samples(f"{path.name}:{number}", line)
            except SamplesError as exc:
                raise SamplesError(f"samples file {path}, line {number}: {exc}") from None
    if not samples:
        raise SamplesError(f"samples file {path}: no request to check (expected one JSON request object a line)")
    return samples


def _line_samples(name: str, line: str) -> list[Sample]:
    try:
        body = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SamplesError(f"not valid JSON ({exc})") from None
    if not isinstance(body, dict) or ("messages" in body) == ("prompt" in body):
        raise SamplesError("expected a JSON object with 'messages' (chat) or 'prompt' (completions), not both")
    raw = line.encode()
    try:
        if "messages" in body:
            parse_chat(raw)
            return [Sample(name, "chat", body)]
        prompts = [p for p in parse_completion(raw).prompts if isinstance(p, str)]
    except InvalidRequest as exc:
        raise SamplesError(exc.message) from None
    if len(prompts) == 1:
        return [Sample(name, "completion", {**body, "prompt": prompts[0]})]
    return [Sample(f"{name}[{i}]", "completion", {**body, "prompt": p}) for i, p in enumerate(prompts)]
