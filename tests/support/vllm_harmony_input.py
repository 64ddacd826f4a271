"""vLLM's own reading of a gpt-oss Responses input, run from a release's source on this machine (the released wheel
unpacked at ~/.cache/token-guard/wheels/src-<version>/vllm; not installed): the functions are taken out of the files
with `ast` and run on the SDK's types, with stand-ins only for vLLM's logger, ids, env settings and error class.

    protocol.py        _default_input_image_details, input_item_parsing (0.34: _normalize_openresponses_input_item),
                       then pydantic's validation of ResponsesRequest.input
    harmony_utils.py   flatten_input_text_content, get_system_or_developer_message, get_developer_message
    harmony.py         response_input_to_harmony, called per item as _render_responses_with_harmony does
"""

from __future__ import annotations

import ast
import logging
import types
import uuid
from pathlib import Path
from typing import Annotated, Any

import openai_harmony as oh
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseReasoningItem,
)
from pydantic import BeforeValidator, TypeAdapter, ValidationError

WHEELS = Path("/root/.cache/token-guard/wheels")
REFUSED = "refused"  # vLLM answers 400
FAILS = "fails"  # vLLM answers 500 (an exception it does not catch)


class VLLMValidationError(ValueError):
    def __init__(self, message: str, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)


def source(release: str) -> Path:
    return WHEELS / f"src-{release}.0" / "vllm"


def _functions(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions (and methods) named, without their decorators, executed in `namespace`."""
    found: list[ast.stmt] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            found.append(node)
    assert len(found) >= len(names) - 1, path  # 0.33 has no _normalize_openresponses_input_item
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def reader(release: str) -> Any:
    """A function of a list of input items: the harmony messages the release renders for them after the preamble,
    or REFUSED / FAILS."""
    root = source(release) / "entrypoints/openai"
    env = types.SimpleNamespace(VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=False)
    names: dict[str, Any] = {
        "Any": Any, "Message": oh.Message, "Role": oh.Role, "TextContent": oh.TextContent, "Author": oh.Author,
        "DeveloperContent": oh.DeveloperContent, "ResponseFunctionToolCall": ResponseFunctionToolCall,
        "ResponseReasoningItem": ResponseReasoningItem, "ResponseOutputMessage": ResponseOutputMessage,
        "ValidationError": ValidationError, "VLLMValidationError": VLLMValidationError, "envs": env,
        "logger": logging.getLogger("vllm"), "random_uuid": lambda: uuid.uuid4().hex,
    }  # fmt: skip
    utils = ("flatten_input_text_content", "get_system_or_developer_message", "get_developer_message")
    _functions(root / "parser/harmony_utils.py", utils, names)
    _functions(root / "responses/harmony.py", ("response_input_to_harmony",), names)
    protocol = ("_default_input_image_details", "input_item_parsing", "_normalize_openresponses_input_item")
    _functions(root / "responses/protocol.py", protocol, names)
    model = types.SimpleNamespace(_normalize_openresponses_input_item=names.get(protocol[2]))
    defaults = BeforeValidator(names["_default_input_image_details"])
    item_type = Annotated[ResponseInputItemParam | ResponseOutputItem, defaults]
    adapter: TypeAdapter[Any] = TypeAdapter(list[item_type])

    def read(items: list[dict[str, Any]]) -> list[oh.Message] | str:
        try:
            parsed = adapter.validate_python(names["input_item_parsing"](model, {"input": items})["input"])
        except ValidationError:
            return REFUSED
        messages: list[oh.Message] = []
        previous: list[ResponseFunctionToolCall] = []
        try:
            for item in parsed:
                message = names["response_input_to_harmony"](item, previous)
                if message is not None:
                    messages.append(message)
                if isinstance(item, ResponseFunctionToolCall):
                    previous.append(item)
        except (ValueError, VLLMValidationError):
            return REFUSED
        except Exception:  # noqa: BLE001
            return FAILS
        return messages

    return read
