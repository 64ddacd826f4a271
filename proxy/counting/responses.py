"""A Responses request (`POST /v1/responses`) as the chat request vLLM renders for it, so that it is counted by the
chat path (and every rule of that path applies: developer -> system, the billing header, families, count source).

Mirrors vLLM 0.31/0.32 `entrypoints/openai/responses/`: `protocol.py` (ResponsesRequest's validators,
build_chat_params, build_tok_params) and `utils.py` (construct_input_messages, _construct_message_from_response_item,
should_continue_final_message, construct_tool_dicts). Two things differ from chat: the prompt is tokenized with
`add_special_tokens` true (build_tok_params leaves vLLM's default), and `input` items become chat messages.

vLLM 0.34 reads more assistant and reasoning items (`fills`): it fills in the type, status and summary an
OpenResponses item may leave out (`_normalize_openresponses_input_item`), gives an output message without content
"", and converts the reasoning and assistant items that stay dicts after validation instead of failing on them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.responses import ResponsesRequest
from proxy.counting.response_tools import check_tool_choice, tool_dicts
from proxy.errors import InvalidRequest

UNSUPPORTED = "Unsupported input item type: {kind} (parameter=input)"
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)
INPUT_PARTS = frozenset({"input_text", "input_image", "input_file", "input_audio"})
CONTINUING = ("in_progress", "incomplete")  # an item with this status is continued, not answered
STATUSES = ("in_progress", "completed", "incomplete")
LOOSE = (list, dict, str)  # what pydantic takes for a TypedDict's Iterable field, from JSON


def responses_chat(
    req: ResponsesRequest, newer: bool, history: list[dict[str, Any]] | None = None, fills: bool = False
) -> ChatRequest:
    """The chat request vLLM renders for `req`; `newer`: the upstream is vLLM 0.32+ (custom tools); `history`: the
    stored conversation its `previous_response_id` continues (policy/ledger.py), rendered between the instructions
    and the new input; `fills`: the upstream is vLLM 0.34+ (its reading of assistant and reasoning items). Raises
    InvalidRequest with vLLM's own text where vLLM refuses the request before rendering it."""
    body = req.body
    if body.get("prompt") is not None:
        raise _vllm_refuses("prompt template is not supported", "prompt")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
    if kwargs and kwargs.get("chat_template") is not None:
        raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template_kwargs")
    choice = body.get("tool_choice", "auto")
    check_tool_choice(req.tools, choice, newer)
    if not req.tools and choice in ("auto", "none"):
        choice = "none"
    items = req.input if isinstance(req.input, str) else [_item(i, item, fills) for i, item in enumerate(req.input)]
    messages = input_messages(req.instructions, items, newer, history, fills)
    return _as_chat(req, messages, tool_dicts(req.tools, newer), _kwargs(body, kwargs or {}, items))


def _vllm_refuses(message: str, param: str) -> InvalidRequest:
    """vLLM's VLLMValidationError text: the parameter is part of the message."""
    return InvalidRequest(f"{message} (parameter={param})", param=param)


# --- input_item_parsing: which items vLLM reads as which SDK model ----------------------------------------------


def _item(index: int, item: dict[str, Any], fills: bool) -> dict[str, Any]:
    """The item with a `kind`: function_call, reasoning, output_message, message, function_call_output, or one of
    0.32's custom_tool_call(_output)."""
    kind = item.get("type")
    where = f"input[{index}]"
    if kind == "function_call":
        for key in ("arguments", "call_id", "name"):
            if not isinstance(item.get(key), str):
                raise InvalidRequest(f"{where}: a function_call needs a string '{key}'.", param="input")
        return {"kind": kind, **item}
    if kind == "reasoning":
        return _reasoning(where, item, fills)
    if kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item.get("output"), str | list):
            raise InvalidRequest(f"{where}: a {kind} needs an 'output'.", param="input")
        return {"kind": kind, **item}
    if kind == "custom_tool_call":
        for key in ("call_id", "name", "input"):
            if not isinstance(item.get(key), str):
                raise InvalidRequest(f"{where}: a custom_tool_call needs a string '{key}'.", param="input")
        return {"kind": kind, **item}
    if kind in (None, "message") and item.get("role") is not None:
        return _message_item(where, item, fills)
    if isinstance(kind, str):
        raise InvalidRequest(UNSUPPORTED.format(kind=kind), param="input")
    raise InvalidRequest(f"{where} is not an input item vLLM reads.", param="input")


def _reasoning(where: str, item: dict[str, Any], fills: bool) -> dict[str, Any]:
    """The item with its `text`, the reasoning vLLM renders: ResponseReasoningItem's (a summary list, content none or
    a list, each part typed) takes the first content part's, else the first summary part's. An item pydantic's
    lazy TypedDict takes instead (a summary or content object or string, or a part it cannot type) stays a dict,
    which 0.31-0.33 refuse and 0.34 reads (_reasoning_dict)."""
    if fills:  # 0.34 fills in what an OpenResponses item may leave out
        summary = [] if item.get("summary") is None else item["summary"]
        item = {**item, "summary": summary, "status": _filled_status(item)}
    summary, content = item.get("summary"), item.get("content")
    if not isinstance(item.get("encrypted_content"), str | None) or item.get("status") not in (None, *STATUSES):
        raise InvalidRequest(f"{where}: not a reasoning item vLLM reads.", param="input")
    if _parts(summary, "summary_text") and (content is None or _parts(content, "reasoning_text")):
        if item.get("encrypted_content"):
            raise _vllm_refuses("Encrypted content is not supported.", "input")
        read: list[dict[str, Any]] = content or summary or []  # content's first part, else the summary's
        return {**item, "kind": "reasoning", "text": read[0]["text"] if read else ""}
    if not isinstance(summary, LOOSE) or ("content" in item and not isinstance(content, LOOSE)):
        raise InvalidRequest(f"{where}: a reasoning item needs a 'summary' array.", param="input")
    if not fills:  # a dict reaches no branch of _construct_message_from_response_item
        raise InvalidRequest(UNSUPPORTED.format(kind="reasoning"), param="input")
    return {**item, "kind": "reasoning", "text": _reasoning_dict(where, item)}


def _reasoning_dict(where: str, item: dict[str, Any]) -> str:
    """vLLM 0.34's reading of a reasoning dict: `content` when present (whatever it holds), else `summary`, listed as
    pydantic's ValidatorIterator lists it (a list's parts, an object's keys, a string's characters), each checked
    as a part: one that is not is pydantic's 400; the first part's text, or "" when there is none."""
    key, part = ("content", "reasoning_text") if "content" in item else ("summary", "summary_text")
    listed: list[Any] = list(item[key])
    if not _parts(listed, part):
        raise InvalidRequest(f"{where}: the parts of a reasoning item's {key} need a type '{part}' and a string "
                             "'text'.", param="input")  # fmt: skip
    return str(listed[0]["text"]) if listed else ""


def _parts(parts: Any, kind: str) -> bool:
    return isinstance(parts, list) and all(
        isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str) for p in parts
    )


def _message_item(where: str, item: dict[str, Any], fills: bool) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(f"{where}: unknown role {role!r}.", param="input")
    # an assistant message with output parts is a ResponseOutputMessage; 0.34 also reads one without a type as one
    typed = item.get("type") == "message" or (fills and "type" not in item)
    if role == "assistant" and isinstance(content, list) and typed:
        status = _filled_status(item) if fills else item.get("status", "completed")
        if status in STATUSES and all(_is_output_part(p) for p in content):
            return {"kind": "output_message", **item, "status": status}
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in INPUT_PARTS:
                raise InvalidRequest(f"{where}: message content parts must be input_text, input_image, input_file "
                                     "or input_audio.", param="input")  # fmt: skip
        # _default_input_image_details
        parts = [{**p, "detail": "auto"} if p["type"] == "input_image" and "detail" not in p else p for p in content]
        return {"kind": "message", "item": {**item, "content": parts}}
    if not isinstance(content, str):
        raise InvalidRequest(f"{where}: message content must be a string or an array of parts.", param="input")
    return {"kind": "message", "item": item}


def _filled_status(item: dict[str, Any]) -> Any:
    """0.34's status of an assistant or reasoning item: "completed" when left out or empty."""
    return "completed" if item.get("status") in (None, "") else item["status"]


def _is_output_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    if part.get("type") == "output_text":
        return isinstance(part.get("text"), str)
    return part.get("type") == "refusal" and isinstance(part.get("refusal"), str)


# --- construct_input_messages -------------------------------------------------------------------------------------


def input_messages(
    instructions: str | None, items: str | list[dict[str, Any]], newer: bool,
    history: list[dict[str, Any]] | None = None, fills: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """The chat messages vLLM builds: the instructions as a first system message, the stored conversation continued
    (`history`), then one message per item, where function calls and reasoning join the previous assistant message
    of this request's input."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    messages += copy.deepcopy(history or [])
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    converted: list[dict[str, Any]] = []
    for item in copy.deepcopy(items):
        message = _from_item(item, converted[-1] if converted else None, newer, fills)
        if message is not None:
            converted.append(message)
    return messages + converted


def _from_item(item: dict[str, Any], prev: dict[str, Any] | None, newer: bool, fills: bool) -> dict[str, Any] | None:
    """A new message, or None when the item only completed the previous assistant message."""
    assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    kind = item["kind"]
    if kind in ("function_call", "custom_tool_call"):
        return _with_call(assistant, _call(item, newer))
    if kind == "reasoning":
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = item["text"]
            return None
        return {"role": "assistant", "reasoning": item["text"]}
    if kind == "output_message":
        return _assistant_text(assistant, _output_text(item["content"], fills))
    if kind == "function_call_output" or (kind == "custom_tool_call_output" and newer):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "custom_tool_call_output":
        raise InvalidRequest(UNSUPPORTED.format(kind=kind), param="input")
    message: dict[str, Any] = item["item"]
    if message.get("role") != "assistant":
        return message
    content = message.get("content")
    if fills:  # 0.34: a string as it is, else the first part's text ("" for none)
        return _assistant_text(assistant, content if isinstance(content, str) else _first_text(content))
    text = content if isinstance(content, str) else content[0].get("text") if content else None
    return message if text is None else _assistant_text(assistant, text)  # 0.33: the message as it is


def _output_text(parts: list[dict[str, Any]], fills: bool) -> str:
    """`item.content[0].text`, only the first part kept; 0.34 reads no part as "". vLLM fails on no part before
    0.34 and on a refusal first (a 500 "list index out of range" or "'ResponseOutputRefusal' object has no attribute
    'text'"): the guard refuses those with a 400 instead, the request's fault."""
    if not parts and fills:
        return ""
    if not parts or parts[0].get("type") != "output_text":
        raise InvalidRequest("An assistant output message must start with an output_text part.", param="input")
    return str(parts[0]["text"])


def _first_text(parts: list[dict[str, Any]] | None) -> str:
    return str(parts[0].get("text", "")) if parts else ""


def _call(item: dict[str, Any], newer: bool) -> dict[str, Any]:
    if item["kind"] == "custom_tool_call":
        if not newer:
            raise InvalidRequest(UNSUPPORTED.format(kind="custom_tool_call"), param="input")
        name, arguments = item["name"], json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    else:
        name, arguments = item["name"], item["arguments"]
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
    return {"id": item["call_id"], "function": {"name": name, "arguments": arguments}, "type": "function"}


def _with_call(assistant: dict[str, Any] | None, call: dict[str, Any]) -> dict[str, Any] | None:
    calls = assistant.get("tool_calls") if assistant is not None else None
    if assistant is not None and calls is None:
        assistant["tool_calls"] = [call]
        return None
    if isinstance(calls, list):
        calls.append(call)
        return None
    return {"role": "assistant", "tool_calls": [call]}


def _assistant_text(assistant: dict[str, Any] | None, text: str) -> dict[str, Any] | None:
    if assistant is not None and assistant.get("content") is None:
        assistant["content"] = text
        return None
    return {"role": "assistant", "content": text}


# --- build_chat_params ----------------------------------------------------------------------------------------------


def _kwargs(body: dict[str, Any], client: dict[str, Any], items: str | list[dict[str, Any]]) -> dict[str, Any]:
    """The template switches vLLM sets, over the client's chat_template_kwargs (build_chat_params)."""
    cont = _continues(items)
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    kwargs = {k: v for k, v in client.items() if k not in ("add_generation_prompt", "continue_final_message")}
    return {**kwargs, "add_generation_prompt": not cont, "continue_final_message": cont, "reasoning_effort": effort}


def _continues(items: str | list[dict[str, Any]]) -> bool:
    """should_continue_final_message: the last item is an unfinished message or reasoning item."""
    if isinstance(items, str) or not items:
        return False
    last = items[-1]
    status = last["item"].get("status") if last["kind"] == "message" else last.get("status")
    return last["kind"] in ("message", "output_message", "reasoning") and status in CONTINUING


def _as_chat(
    req: ResponsesRequest, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
) -> ChatRequest:
    """An equivalent chat request: its body is what the upstream is asked to count when it counts."""
    effort = kwargs.pop("reasoning_effort")
    add_generation_prompt = kwargs.pop("add_generation_prompt")
    continue_final_message = kwargs.pop("continue_final_message")
    body: dict[str, Any] = {
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "add_special_tokens": True,  # Responses leaves vLLM's tokenizer default: a BOS post-processor adds one
    }
    if effort is not None:
        body["reasoning_effort"] = effort  # chat derives enable_thinking from it, unless the client set it
    if tools is not None:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if req.model is not None:
        body["model"] = req.model
    if req.body.get("kv_transfer_params") is not None:  # ids vLLM may run in place of the messages
        body["kv_transfer_params"] = req.body["kv_transfer_params"]
    return ChatRequest(
        body=body, model=req.model, messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, add_special_tokens=True, chat_template=None,
        chat_template_kwargs=kwargs, max_tokens=None, max_completion_tokens=None, min_tokens=None, n=1,
        stream=req.stream,
    )  # fmt: skip
