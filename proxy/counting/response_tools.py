"""A Responses request's tools as the chat template sees them, and vLLM's checks of its `tool_choice`.

Mirrors vLLM 0.31/0.32 `ResponsesRequest.check_tool_usage` (0.32: named custom tools, namespace names resolved) and
`construct_tool_dicts` -> `iter_response_function_tool_dicts` (0.32: `get_function_tools`): function tools become chat
tools, namespace tools are flattened to `<namespace>__<name>`, 0.32 turns custom tools into a function with one string
`input`, and built-in tools (web_search, ...) are never rendered.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

NOT_FOUND = "Tool choice 'function' not found in 'tools' parameter."
CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def _refused(message: str, param: str = "tool_choice") -> InvalidRequest:
    return InvalidRequest(f"{message} (parameter={param})", param=param)


def check_tool_choice(tools: list[Any] | None, choice: Any, newer: bool) -> None:
    """vLLM's refusals of a tool_choice the tools cannot satisfy (and 0.32's of grammar-format custom tools)."""
    if newer:
        for tool in tools or []:
            fmt = tool.get("format") if isinstance(tool, dict) else None
            if tool.get("type") == "custom" and isinstance(fmt, dict) and fmt.get("type") == "grammar":
                raise _refused("Custom tools with a grammar format are not supported; only free-form text custom "
                               "tools are accepted.", "tools")  # fmt: skip
    named = isinstance(choice, dict) and choice.get("type") in (("function", "custom") if newer else ("function",))
    if not tools:
        if choice == "required":
            raise _refused("Tool choice 'required' must be specified with 'tools' parameter.")
        if named:
            raise _refused(NOT_FOUND)
        return
    if named:
        _check_named(tools, choice.get("name"), newer)


def _check_named(tools: list[Any], name: Any, newer: bool) -> None:
    names: set[Any] = set()
    flattened: dict[Any, list[str]] = {}  # 0.32: a bare inner name -> the namespaced names it may mean
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") != "namespace":
            names.add(tool.get("name"))
            continue
        inner = tool.get("tools")
        if not isinstance(inner, list):
            return  # vLLM gives up checking here
        for t in inner:
            bare = t.get("name") if isinstance(t, dict) else None
            flat = f"{tool.get('name')}__{bare}"
            names.add(flat)
            if newer:
                flattened.setdefault(bare, []).append(flat)
            else:
                names.add(bare)
    if name and name in names:
        return
    candidates = flattened.get(name, []) if name else []
    if len(candidates) > 1:
        raise _refused(f"Tool choice '{name}' is ambiguous: it is defined in more than one namespace "
                       f"({', '.join(candidates)}). Select it by its full '<namespace>__<name>' name.")  # fmt: skip
    if len(candidates) != 1:
        raise _refused(NOT_FOUND)


def tool_dicts(tools: list[Any] | None, newer: bool) -> list[dict[str, Any]] | None:
    """None without tools; a list (maybe empty, when every tool is a built-in) otherwise."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            if not isinstance(tool.get("name"), str):
                raise InvalidRequest(f"tools[{i}]: a function tool needs a string 'name'.", param="tools")
            out.append(_function(tool))
        elif kind == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    out.append(_function(inner, f"{tool.get('name')}__{inner.get('name')}"))
        elif kind == "custom" and newer:
            shim = {"name": tool.get("name"), "description": tool.get("description"), "parameters": CUSTOM_PARAMETERS}
            out.append(_function(shim))
    return out


def _function(tool: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """FunctionTool -> FunctionDefinition -> a chat tool, as vLLM dumps it: strict and defer_loading only when set."""
    function: dict[str, Any] = {
        "name": name if name is not None else tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
    }
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}
