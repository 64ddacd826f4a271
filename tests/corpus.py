"""The parity corpus: chat requests and completion prompts whose token counts the guard must get exactly right.

Shared by the unit parity tests (against transformers), the end-to-end tests (against the simulator) and
`make e2e` (against a real vLLM's /tokenize). Each chat case holds the request fields that change the count.
"""

from __future__ import annotations

from typing import Any

from proxy.drift.samples import WEATHER_TOOL as SAMPLE_TOOL

LONG_TEXT = (
    "The quick brown fox jumps over the lazy dog. " * 40
    + "\n\ndef add(a, b):\n    return a + b\n\n"
    + "東京は日本の首都です。今日は良い天気ですね。 " * 20
    + "Emoji run: 🎉🚀👍🏽🧑‍🤝‍🧑 " * 15
)

WEATHER_TOOL = SAMPLE_TOOL  # the same tool the built-in `token-guard doctor` samples use

CHAT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"messages": [{"role": "user", "content": "Hello!"}]}),
    (
        "system",
        {
            "messages": [
                {"role": "system", "content": "You are a terse assistant. Answer in one line."},
                {"role": "user", "content": "What is the capital of France?"},
            ]
        },
    ),
    (
        "system-ends-in-space",
        {"messages": [{"role": "system", "content": "Be brief:  "}, {"role": "user", "content": "  indented"}]},
    ),
    (
        "multi-turn",
        {
            "messages": [
                {"role": "system", "content": "You help with maths."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "6."},
                {"role": "user", "content": "Now multiply them."},
            ]
        },
    ),
    (
        "tools",
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
    (
        "bare-tool",
        {
            "messages": [{"role": "user", "content": "Ping the server."}],
            "tools": [{"type": "function", "function": {"name": "ping"}}],
        },
    ),
    (
        "list-of-parts",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}],
                }
            ]
        },
    ),
    (
        "list-of-parts-with-empty",  # vLLM drops a part that parses to an empty text before joining the rest
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": ""}]},
                {
                    "role": "user",
                    "content": ["", {"type": "text", "text": "Hi"}, {"type": "text", "text": ""}, "there", ""],
                },
            ]
        },
    ),
    (
        "cjk-emoji",
        {"messages": [{"role": "user", "content": "你好，世界！こんにちは 🌏🎌 Ünïcödé — “quotes” …"}]},
    ),
    ("long-text", {"messages": [{"role": "user", "content": LONG_TEXT}]}),
    (
        "continue-final-message",
        {
            "messages": [
                {"role": "user", "content": "Write a haiku about rain."},
                {"role": "assistant", "content": "Soft rain on the roof"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    (
        "no-generation-prompt",
        {"messages": [{"role": "user", "content": "Just render me."}], "add_generation_prompt": False},
    ),
    (
        "developer-role",
        {"messages": [{"role": "developer", "content": "Reply in French."}, {"role": "user", "content": "Hi"}]},
    ),
    (
        "special-token-text",
        {"messages": [{"role": "user", "content": "Literal <｜User｜> marker and <think> tags </think>."}]},
    ),
]

COMPLETION_PROMPTS: list[tuple[str, str]] = [
    ("short", "Hello world, this is a test."),
    ("code", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("cjk", "日本語の文章とEnglish mixed together。"),
    ("long", LONG_TEXT),
]
