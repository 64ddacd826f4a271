"""A Responses request's tools, as vLLM 0.31 / 0.32 check and render them: `ResponsesRequest.check_tool_usage` and
(0.32) `check_custom_tool_format` and `_resolve_named_tool_choice` (responses/protocol.py), then `construct_tool_dicts`
(responses/utils.py) over `iter_response_function_tool_dicts` (tool_parsers/utils.py; 0.32 `get_function_tools`),
each tool dumped by `FunctionDefinition`'s serializer."""

from __future__ import annotations

from typing import Any

from simulator.errors import validation_error

NOT_FOUND = "Tool choice 'function' not found in 'tools' parameter."
SEPARATOR = "__"  # flat_namespace_tool_name
CUSTOM_PARAMETERS = {  # custom_tool_parameters(): a custom tool is shown as a function of one string
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def check_custom_formats(tools: Any) -> None:
    """0.32's check_custom_tool_format: a grammar-format custom tool is refused."""
    for tool in tools if isinstance(tools, list) else []:
        fmt = tool.get("format") if isinstance(tool, dict) else None
        if tool.get("type") == "custom" and isinstance(fmt, dict) and fmt.get("type") == "grammar":
            raise validation_error("Custom tools with a grammar format are not supported; only free-form text "
                                   "custom tools are accepted.", parameter="tools")  # fmt: skip


def check_tool_usage(body: dict[str, Any], newer: bool) -> None:
    """check_tool_usage: no tools turn "auto" into "none"; a choice no tool satisfies is refused; 0.32 resolves a
    bare name of a namespaced function to its `<namespace>__<name>`."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    named = isinstance(choice, dict) and choice.get("type") in (("function", "custom") if newer else ("function",))
    if not tools:
        if choice in ("auto", "none"):
            body["tool_choice"] = "none"
        elif choice == "required":
            raise validation_error("Tool choice 'required' must be specified with 'tools' parameter.",
                                   parameter="tool_choice")  # fmt: skip
        elif named:
            raise validation_error(NOT_FOUND, parameter="tool_choice")
        return
    if not named or not isinstance(tools, list):
        return
    name = choice.get("name")
    if not name:
        raise validation_error(NOT_FOUND, parameter="tool_choice")
    resolved = _resolved(name, tools, newer)
    if resolved != name:
        body["tool_choice"] = {**choice, "name": resolved}


def _resolved(name: Any, tools: list[Any], newer: bool) -> Any:
    exact: set[Any] = set()
    local: dict[Any, list[str]] = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") != "namespace":
            exact.add(tool.get("name"))
            continue
        inner, namespace = tool.get("tools"), tool.get("name")
        if not isinstance(inner, list) or (newer and not isinstance(namespace, str)):
            return name  # vLLM stops looking
        for t in inner:
            bare = t.get("name") if isinstance(t, dict) else None
            if isinstance(bare, str) or not newer:
                exact.add(f"{namespace}{SEPARATOR}{bare}")
                local.setdefault(bare, []).append(f"{namespace}{SEPARATOR}{bare}")
    if not newer:  # 0.31 checks bare and flat names alike, and resolves nothing
        exact |= set(local)
    if name in exact:
        return name
    candidates = local.get(name, []) if newer else []
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise validation_error(f"Tool choice '{name}' is ambiguous: it is defined in more than one namespace "
                               f"({', '.join(candidates)}). Select it by its full '<namespace>__<name>' name.",
                               parameter="tool_choice")  # fmt: skip
    raise validation_error(NOT_FOUND, parameter="tool_choice")


def tool_dicts(tools: list[dict[str, Any]], newer: bool) -> list[dict[str, Any]] | None:
    """construct_tool_dicts: None without tools (a vLLM serving with --exclude-tools-when-tool-choice-none aside),
    else each function tool the model is shown; built-in tools (web_search, ...) are never rendered."""
    if not tools:
        return None
    shown: list[dict[str, Any]] = []
    for tool in tools:
        kind = tool.get("type")
        if kind == "function":
            shown.append(_function(tool))
        elif kind == "namespace":
            inner = [t for t in tool.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
            shown += [_function({**t, "name": f"{tool.get('name')}{SEPARATOR}{t.get('name')}"}) for t in inner]
        elif kind == "custom" and newer:
            shim = {"name": tool.get("name"), "description": tool.get("description"), "parameters": CUSTOM_PARAMETERS}
            shown.append(_function(shim))
    return shown


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """ChatCompletionToolsParam(function=FunctionDefinition(...)).model_dump(): strict and defer_loading only
    when set."""
    function = {"name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("parameters")}
    function |= {key: tool[key] for key in ("strict", "defer_loading") if tool.get(key) is not None}
    return {"type": "function", "function": function}
