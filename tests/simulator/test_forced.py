"""Output that guided decoding forces: a named tool_choice is answered with a call to that tool whose arguments are
JSON fitting its parameter schema (finish_reason "stop", as vLLM gives for a named tool), streamed as tool-call deltas;
a json_schema response format gets JSON content; max_tokens that cuts the JSON short ends in "length"."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simulator.schema_example import example
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    sse_json,
)

HELLO = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def post(sim: RunningSim, **fields: Any) -> Any:
    return sim.client.post("/v1/chat/completions", json={"messages": HELLO, "tools": TOOLS, **fields})


def test_a_named_tool_choice_is_answered_with_a_call_to_it(sim: RunningSim) -> None:
    body = post(sim, tool_choice=NAMED, max_tokens=200).json()
    (choice,) = body["choices"]
    message = choice["message"]
    assert list(message) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "tool_calls",
        "reasoning",
    ]
    assert message["content"] == ""
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == set(WEATHER["properties"])
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int) and arguments["days"] >= 1
    assert arguments["unit"] == "celsius" and arguments["hourly"] is True
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    # The argument tokens plus the EOS that ended them.
    tokens = sim.client.post("/tokenize", json={"prompt": call["function"]["arguments"], "add_special_tokens": False})
    assert body["usage"]["completion_tokens"] == len(tokens.json()["tokens"]) + 1


def test_max_tokens_that_cuts_the_arguments_ends_in_length(sim032: RunningSim) -> None:
    choice = post(sim032, tool_choice=NAMED, max_tokens=3).json()["choices"][0]
    arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.dumps(example(WEATHER)).startswith(arguments) and arguments != json.dumps(example(WEATHER))
    assert choice["finish_reason"] == "length"


def test_a_streamed_tool_call_carries_the_same_call_in_deltas(sim032: RunningSim) -> None:
    whole = post(sim032, tool_choice=NAMED, max_tokens=200).json()["choices"][0]["message"]["tool_calls"][0]
    chunks = sse_json(post(sim032, tool_choice=NAMED, max_tokens=200, stream=True).text)
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    first, *rest = [d["tool_calls"][0] for d in deltas]
    assert list(first) == ["id", "type", "index", "function"] and first["function"]["name"] == "get_weather"
    assert all(list(call) == ["index", "function"] and list(call["function"]) == ["arguments"] for call in rest)
    assert "".join(call["function"]["arguments"] for call in [first, *rest]) == whole["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_auto_and_none_still_get_text(sim032: RunningSim) -> None:
    for choice in ("auto", "none"):
        message = post(sim032, tool_choice=choice, max_tokens=5).json()["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"]


def test_a_tool_choice_naming_no_given_tool_is_refused(sim032: RunningSim) -> None:
    response = post(sim032, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert response.status_code == 400
    assert "does not match any of the specified `tools`" in response.json()["error"]["message"]


def test_a_json_schema_response_format_gets_json_content(sim032: RunningSim) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    response = sim032.client.post(
        "/v1/chat/completions", json={"messages": HELLO, "response_format": schema, "max_tokens": 200}
    )
    choice = response.json()["choices"][0]
    assert json.loads(choice["message"]["content"]) == example(WEATHER)
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string"}, "the"),
        ({"type": ["null", "integer"]}, 1),
        ({"type": "number", "minimum": 3}, 3),
        ({"const": "x"}, "x"),
        ({"anyOf": [{"type": "null"}, {"type": "boolean"}]}, True),
        ({"type": "array", "items": {"type": "integer"}}, [1]),
        ({"properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string", "enum": ["b"]}}}, {"a": "b"}),
        ({"type": "object"}, {}),
    ],
)
def test_example_values_fit_their_schema(schema: dict[str, Any], value: Any) -> None:
    assert example(schema) == value


def test_recursive_schemas_end() -> None:
    tree = {"$ref": "#/$defs/Node", "$defs": {"Node": {"properties": {"child": {"$ref": "#/$defs/Node"}}}}}
    depth, node = 0, example(tree)
    while node:
        node, depth = node["child"], depth + 1
    assert 0 < depth < 10
