"""Turn OpenAI chat messages into the "conversation" vLLM hands to the chat template (docs/vllm-wire-contract.md,
section 12.1).

vLLM joins the text parts of list content with "\\n" for templates that treat content as a string, keeps them as
`{"type": "text", "text": ...}` parts for templates that loop over `message['content']`, moves a chat request's
`reasoning_content` to `reasoning`, and parses tool-call arguments from JSON strings into objects (vLLM 0.31/0.32:
`entrypoints/chat_utils.py`, `_parse_chat_message_content` and `_postprocess_messages`). Counting exactly means
reproducing each of these steps here, not through the installed transformers, whose own preparation changes between
releases (5.23 copies `reasoning` into `thinking`; the 5.17 and 5.19 that vLLM 0.31 and 0.32 bundle do not).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any, Literal

import jinja2
import jinja2.nodes as jn

from proxy.api.body import json_arguments

ContentFormat = Literal["string", "openai"]

# Part type -> the field holding its text; vLLM skips text and refusal parts whose value is null.
_TEXT_PART_FIELDS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
                     "thinking": "thinking"}  # fmt: skip
# Parts whose token count depends on the model's processor (images, audio, video, files): only vLLM knows it.
MEDIA_PART_TYPES = frozenset(
    {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds",
     "video_url", "file"}
)  # fmt: skip


class ConversationError(ValueError):
    """A message the template cannot be given: the text says which one and why."""


class MediaPart(ConversationError):
    """A content part (image, audio, video, file) whose prompt tokens only the upstream's processor can count."""


BILLING_HEADER = "x-anthropic-billing-header"


def to_conversation(
    messages: list[Any], content_format: ContentFormat, strip_billing_header: bool = False
) -> list[dict[str, Any]]:
    """`strip_billing_header`: vLLM 0.32+ drops a first line starting with "x-anthropic-billing-header" from system
    text parts (Claude Code's per-request attribution, which would defeat the prefix cache)."""
    conversation = [_convert_message(i, m, content_format, strip_billing_header) for i, m in enumerate(messages)]
    _parse_tool_call_arguments(conversation)
    return conversation


def _convert_message(index: int, message: Any, content_format: ContentFormat, strip: bool) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ConversationError(f"messages[{index}] must be an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise ConversationError(f"messages[{index}].role must be a string")
    parts = _content_parts(index, message.get("content"), strip and role == "system")
    content: Any
    if content_format == "openai" and (role != "tool" or _referenced(parts)):  # vLLM joins text-only tool results
        content = [{**extra, "type": "text", "text": text} if extra is not _REFERENCE
                   else {"type": "tool_reference", "name": text} for text, extra in parts]  # fmt: skip
    elif content_format == "openai":  # a tool message's parts, kept as dicts, empty texts included, then joined
        content = "\n".join(text for text, _ in parts)
    else:  # vLLM keeps only the parts that parse to something truthy: an empty text is dropped, not joined
        content = "\n".join(text for text, _ in parts if text)
    converted: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            converted["tool_calls"] = _copy_tool_calls(index, message["tool_calls"])
        # A chat request's reasoning_content becomes reasoning when that is absent (ChatCompletionRequest's
        # normalization); the template is then handed both names.
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            converted["reasoning"] = converted["reasoning_content"] = reasoning
    if role == "tool" and "tool_call_id" in message:
        converted["tool_call_id"] = message["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            converted[key] = message[key]
    if role == "developer":
        converted["tools"] = message.get("tools")
    return converted


_NO_EXTRA: dict[str, Any] = {}
_REFERENCE: dict[str, Any] = {}  # a tool_reference part (Anthropic's tool search): its text is the tool's name


def _referenced(parts: list[tuple[str, dict[str, Any]]]) -> bool:
    """A tool message with a tool_reference part keeps its parts as dicts (asked only of tool messages: the scan is
    per part, on every request)."""
    return any(extra is _REFERENCE for _, extra in parts)


def _content_parts(index: int, content: Any, strip: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Each text part's text, with the part's other keys (vLLM keeps them on "openai"-format parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if strip else [content]
    if not isinstance(content, list):
        raise ConversationError(f"messages[{index}].content must be a string, a list of parts or null")
    if strip:
        content = _without_billing_header(content)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts.append((part, _NO_EXTRA))
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        field = _TEXT_PART_FIELDS.get(kind) if isinstance(kind, str) else None
        if kind == "tool_reference":  # passed through as-is for the template to expand (its name, or its dict)
            name = part.get("name")
            if not isinstance(name, str):
                raise ConversationError(f"messages[{index}].content[{j}].name must be a string")
            parts.append((name, _REFERENCE))
            continue
        if field is None:
            if kind in MEDIA_PART_TYPES:
                raise MediaPart(f"messages[{index}].content[{j}] is a {kind} part; its tokens depend on the model's "
                                "processor")  # fmt: skip
            raise ConversationError(f"messages[{index}].content[{j}] is not a text part; this guard counts text-only "
                                    "prompts")  # fmt: skip
        text = part.get(field)
        if text is None:
            continue
        if not isinstance(text, str):
            raise ConversationError(f"messages[{index}].content[{j}].{field} must be a string")
        extra = {k: v for k, v in part.items() if k not in ("type", "text", "refusal", "thinking", "uuid")}
        parts.append((text, extra or _NO_EXTRA))
    return parts


def _without_billing_header(parts: list[Any]) -> list[Any]:
    out = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) and part.get(
            "type") == "text" else None  # fmt: skip
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
        elif rest := text.partition("\n")[2]:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _copy_tool_calls(index: int, calls: Any) -> list[Any]:
    if not isinstance(calls, list):
        raise ConversationError(f"messages[{index}].tool_calls must be a list")
    copied = []
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            # vLLM's request model validates each call into OpenAI's typed dicts, whose field order it keeps:
            # id, function (arguments before name), type. Templates that dump a call with tojson show that order.
            call = {**_in_order(call, CALL_ORDER), "function": _in_order(call["function"], FUNCTION_ORDER)}
            call = _in_order(call, CALL_ORDER)
        copied.append(call)
    return copied


CALL_ORDER = ("id", "function", "type")
FUNCTION_ORDER = ("arguments", "name")


def _in_order(fields: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    return {**{k: fields[k] for k in order if k in fields}, **{k: v for k, v in fields.items() if k not in order}}


def _parse_tool_call_arguments(conversation: list[dict[str, Any]]) -> None:
    # vLLM hands templates the arguments as objects, as transformers' tool-use templates expect; missing or
    # malformed (or unreadable: an integer too long) arguments become {} so that one bad turn in the history does not
    # fail every later request.
    for message in conversation:
        calls = message.get("tool_calls")
        if calls == []:
            del message["tool_calls"]
        for call in calls or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or call.get("type", "function") != "function":
                raise ConversationError("assistant tool_calls entries must be objects of type 'function'")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif isinstance(arguments, str):
                parsed = json_arguments(arguments)
                function["arguments"] = parsed if isinstance(parsed, dict) else {}


# --- content-format detection: the same walk over the template's syntax tree that vLLM's "auto" mode does ---


@lru_cache(maxsize=64)  # a parse costs milliseconds; bounded, since requests may bring templates of their own
def detect_content_format(chat_template: str, namespaces: bool = False) -> ContentFormat:
    """`namespaces`: the upstream's detection follows namespace aliases (vLLM 0.33+: `namespace(rest=messages)`,
    `ns.rest = messages`)."""
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        return "string"
    return "openai" if next(_content_loops(ast, namespaces), None) is not None else "string"


def _is_var(node: jn.Node, name: str) -> bool:
    """`name`, or for a dotted alias "ns.rest" (0.33+) the attribute `ns.rest`."""
    if isinstance(node, jn.Getattr) and "." in name:
        base, _, attr = name.rpartition(".")
        return node.attr == attr and _is_var(node.node, base)
    return isinstance(node, jn.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jn.Node, name: str, key: str) -> bool:
    if isinstance(node, jn.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jn.Const) and node.arg.value == key
    if isinstance(node, jn.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_access(node: jn.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jn.Filter):
        return node.node is not None and _is_access(node.node, name, key)
    if isinstance(node, jn.Test):
        return _is_access(node.node, name, key)
    if isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Slice):
        return _is_access(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _aliases(root: jn.Template, name: str, namespaces: bool) -> Iterator[str]:
    yield name
    pending, seen = deque([name]), {name}
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jn.Assign):
            for alias in _assigned(assign, current, namespaces):
                yield alias
                if alias != current and (not namespaces or alias not in seen):
                    seen.add(alias)
                    pending.append(alias)


def _assigned(assign: jn.Assign, name: str, namespaces: bool) -> list[str]:
    """The names `assign` gives `name`: its target; with `namespaces` (0.33+) also "ns.rest" for
    `ns = namespace(rest=name)` and for `ns.rest = name`."""
    target, value = assign.target, assign.node
    if isinstance(target, jn.Name) and _is_access(value, name):
        return [target.name]
    if not namespaces:
        return []
    if isinstance(target, jn.Name) and isinstance(value, jn.Call) and isinstance(value.node, jn.Name) \
            and value.node.name == "namespace":  # fmt: skip
        return [f"{target.name}.{kw.key}" for kw in value.kwargs if _is_access(kw.value, name)]
    if isinstance(target, jn.NSRef) and _is_access(value, name):
        return [f"{target.name}.{target.attr}"]
    return []


def _loop_targets(root: jn.Template, iterables: list[str], key: str | None) -> Iterator[str]:
    for loop in root.find_all(jn.For):
        if isinstance(loop.target, jn.Name) and any(_is_access(loop.iter, n, key) for n in iterables):
            yield loop.target.name


def _content_loops(root: jn.Template, namespaces: bool) -> Iterator[jn.For]:
    """Loops over a message's content: directly, through a macro parameter bound to it, or (outside macros) over
    a top-level variable named `content`, as vLLM's detection walks them."""
    message_names = list(_loop_targets(root, list(_aliases(root, "messages", namespaces)), None))
    bound, in_macros = _macro_content_params(root, message_names)
    for loop in root.find_all(jn.For):
        if any(_is_access(loop.iter, n, "content") for n in message_names):
            yield loop
        elif isinstance(loop.iter, jn.Name) and (
            loop.iter.name in bound.get(id(loop), ()) or (id(loop) not in in_macros and loop.iter.name == "content")
        ):
            yield loop


def _macro_content_params(root: jn.Template, message_names: list[str]) -> tuple[dict[int, set[str]], set[int]]:
    """For each loop inside a macro, the macro's parameters that some call binds to a message's content; and the
    ids of every loop inside a macro."""
    bound: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jn.Macro):
        names = [a.name for a in macro.args]
        params: set[str] = set()
        for call in root.find_all(jn.Call):
            if not (isinstance(call.node, jn.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(names) and any(_is_access(arg, n, "content") for n in message_names):
                    params.add(names[i])
            for kw in call.kwargs:
                if kw.key in names and any(_is_access(kw.value, n, "content") for n in message_names):
                    params.add(kw.key)
        for loop in macro.find_all(jn.For):
            in_macros.add(id(loop))
            if params:
                bound[id(loop)] = params
    return bound, in_macros


def to_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's request model re-serializes them before the template sees them: only the known keys, in its
    order, with `description` and `parameters` null when absent. That changes what `tools | tojson` renders."""
    if tools is None:
        return None
    normalized = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConversationError(f"tools[{i}] must be an object with a 'function' that has a string 'name'")
        out: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            out["strict"] = function["strict"]
        defer_loading = function.get("defer_loading", tool.get("defer_loading"))
        if defer_loading is not None:
            out["defer_loading"] = defer_loading
        entry: dict[str, Any] = {"type": "function", "function": out}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        normalized.append(entry)
    return normalized


# Names vLLM hands the template itself, or refuses in chat_template_kwargs; a client's value for them is not used.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "chat_template", "tokenize", "return_dict", "tools", "add_generation_prompt",
     "continue_final_message"}
)  # fmt: skip


def merge_kwargs(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's merge (renderers/params.py): an override of None or "auto" keeps the default."""
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None and v != "auto"}}


def template_inputs(
    body: dict[str, Any], kwargs: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The extra variables vLLM hands the template, in its merge order: the server's default_chat_template_kwargs,
    under the client's chat_template_kwargs, under the request's own `documents` and `reasoning_effort` (with
    `enable_thinking` derived from the latter unless the client set it)."""
    effort = body.get("reasoning_effort")
    fields: dict[str, Any] = {"documents": body.get("documents"), "reasoning_effort": effort}
    if effort is not None and "enable_thinking" not in kwargs:
        fields["enable_thinking"] = effort != "none"
    merged = merge_kwargs(defaults or {}, merge_kwargs(kwargs, fields))
    return {k: v for k, v in merged.items() if k not in RESERVED_TEMPLATE_KWARGS}
