"""Chat output that guided decoding forces, as a vLLM started with a tool parser answers it: a named `tool_choice`
makes the model write that function's arguments as JSON (answered as a tool call, finish_reason "stop"), and a
`json_schema` or `json_object` response format makes it write JSON content. The JSON fits the schema's shape and
types (schema_example.py). `tool_choice` "auto" and "required" are not forced here: the model writes its filler."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simulator.errors import ApiError
from simulator.schema_example import example

_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def check_tool_choice(body: Mapping[str, Any]) -> None:
    """vLLM's request validator (check_tool_usage), after `tools` was found present."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto", "required"):
        return
    if not isinstance(choice, dict):
        raise ApiError(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or "required" are supported.'
        )
    function = choice.get("function")
    if not isinstance(function, dict):
        raise ApiError(f"Invalid value for `function`: `{function}` in `tool_choice`! {_USAGE}")
    if "name" not in function:
        raise ApiError(f"Expected field `name` in `function` in `tool_choice`! {_USAGE}")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise ApiError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_USAGE}")
    if _tool(body, name) is None:
        raise ApiError("The tool specified in `tool_choice` does not match any of the specified `tools`")


def forced_tool(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(function name, arguments JSON) when `tool_choice` names a function; call after check_tool_choice."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    name = str(choice["function"]["name"])
    tool = _tool(body, name) or {}
    return name, _json(example(tool.get("parameters") or {"type": "object"}))


def forced_content(body: Mapping[str, Any]) -> str | None:
    """The JSON content a `json_schema` or `json_object` response format forces."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return "{}"
    spec = response_format.get("json_schema")
    if response_format.get("type") != "json_schema" or not isinstance(spec, dict):
        return None
    return _json(example(spec.get("schema") or {"type": "object"}))


def _tool(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            return function
    return None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
