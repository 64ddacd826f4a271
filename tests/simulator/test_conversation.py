"""The simulator's own reading of chat messages (simulator/conversation.py, simulator/content_format.py), held to what
vLLM 0.31 and 0.32's renderer does with them (renderers/chat_utils.py, renderers/hf.py), apart from the guard's
reading: where the two differ, a test of the guard against the simulator fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator import SimulatorSettings
from simulator.content_format import detect_content_format
from simulator.conversation import for_template, read_messages, read_tools
from simulator.errors import ApiError
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_hf_tokenizer,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    running_simulator,
)

HEADER = "x-anthropic-billing-header: cc_version=2.1.3; cch=5f2a1"
USER = {"role": "user", "content": "Hello there"}


def tokens(sim: RunningSim, messages: list[dict[str, Any]]) -> int:
    answer = sim.client.post("/tokenize", json={"model": "tiny", "messages": messages})
    assert answer.status_code == 200, answer.text
    count: int = answer.json()["count"]
    return count


def test_032_drops_claude_codes_billing_line_from_system_text_and_031_keeps_it(
    sim031: RunningSim, sim032: RunningSim
) -> None:
    with_header = [{"role": "system", "content": f"{HEADER}\nBe brief."}, USER]
    without = [{"role": "system", "content": "Be brief."}, USER]
    assert tokens(sim032, with_header) == tokens(sim032, without)
    assert tokens(sim031, with_header) > tokens(sim031, without)
    parts = [{"role": "system", "content": [{"type": "text", "text": HEADER}, {"type": "text", "text": "Be brief."}]}]
    assert tokens(sim032, [*parts, USER]) == tokens(sim032, without)  # a part that is only the line goes whole
    assert tokens(sim032, [{"role": "user", "content": f"{HEADER}\nBe brief."}]) > tokens(sim032, [USER])


def test_a_media_part_is_refused_as_a_text_only_model_refuses_it(sim032: RunningSim) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    answer = sim032.client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": [image]}]}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "At most 0 image(s) may be provided in one prompt."


def test_an_unknown_part_type_is_refused_with_the_types_vllm_takes(sim032: RunningSim) -> None:
    answer = sim032.client.post(
        "/tokenize", json={"model": "tiny", "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}
    )
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert message.startswith("Unsupported chat content part type: 'hologram'. Supported types: ")
    assert "input_text" in message and "tool_reference" in message and message.endswith("value=hologram)")


def test_openai_text_parts_keep_only_the_fields_no_content_part_model_declares() -> None:
    part = {"type": "text", "text": "hi", "name": "n", "closed": True, "cache_control": {"type": "ephemeral"}}
    (message,) = read_messages([{"role": "user", "content": [part]}], "openai", strips_billing=True)
    assert message["content"] == [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    with pytest.raises(ApiError, match="Missing 'type' field"):  # a uuid sends any part down the media path
        read_messages([{"role": "user", "content": [{"type": "text", "text": "hi", "uuid": "u"}]}], "openai", True)


def test_string_format_joins_text_parts_and_drops_empty_ones() -> None:
    content = ["a", {"type": "input_text", "text": "b"}, {"type": "text", "text": ""}, {"type": "refusal",
               "refusal": None}, {"type": "thinking", "thinking": "c"}]  # fmt: skip
    (message,) = read_messages([{"role": "user", "content": content}], "string", strips_billing=True)
    assert message == {"role": "user", "content": "a\nb\nc"}


def test_tool_results_are_joined_unless_a_part_is_a_tool_reference() -> None:
    texts = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}, {"type": "text",
             "text": "y"}]}  # fmt: skip
    reference = {"role": "tool", "content": [{"type": "text", "text": "x"}, {"type": "tool_reference", "name": "t"}]}
    joined, kept = read_messages([texts, reference], "openai", strips_billing=True)
    assert joined == {"role": "tool", "content": "x\ny", "tool_call_id": "c1"}
    assert kept["content"] == [{"type": "text", "text": "x"}, {"type": "tool_reference", "name": "t"}]


def test_assistant_turns_as_the_request_model_and_postprocessing_leave_them() -> None:
    calls = [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}, "id": "c1"},
             {"function": {"name": "g", "arguments": "not json"}, "id": "c2"},
             {"function": {"name": "h", "arguments": "[1]"}}]  # fmt: skip
    messages = [{"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": "because"},
                {"role": "assistant", "content": "done", "tool_calls": []}]  # fmt: skip
    first, second = read_messages(messages, "string", strips_billing=True)
    assert [list(call) for call in first["tool_calls"]] == [
        ["id", "function", "type"],
        ["id", "function"],
        ["function"],
    ]
    assert [list(call["function"]) for call in first["tool_calls"]] == [["arguments", "name"]] * 3
    assert [call["function"]["arguments"] for call in first["tool_calls"]] == [{"a": 1}, {}, {}]
    assert first["reasoning"] == first["reasoning_content"] == "because" and first["content"] == ""
    assert second == {"role": "assistant", "content": "done"}


def test_a_call_of_another_type_is_refused() -> None:
    with pytest.raises(ApiError, match="only support assistant tool_calls of type 'function'"):
        read_messages([{"role": "assistant", "tool_calls": [{"type": "custom", "custom": {}}]}], "string", True)


def test_tools_as_the_request_models_dump_them() -> None:
    tools = [{"type": "function", "defer_loading": True, "function": {"name": "f", "extra": 1}},
             {"function": {"name": "g", "description": "d", "parameters": {}, "strict": True}}]  # fmt: skip
    assert read_tools(tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None,
                                          "defer_loading": True}, "defer_loading": True},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": {}, "strict": True}},
    ]  # fmt: skip
    with pytest.raises(ApiError, match="Input should be 'function'"):
        read_tools([{"type": "code", "function": {"name": "f"}}])


LOOPS_IN_GENERATION = (
    "{% for message in messages %}{% if message.role == 'assistant' %}{% generation %}"
    "{% for part in message.content %}{{ part.text }}{% endfor %}{% endgeneration %}"
    "{% else %}{% for part in message['content'] %}<{{ part.text }}>{% endfor %}{% endif %}{% endfor %}"
)


def test_content_format_is_read_in_transformers_environment() -> None:
    """vLLM parses the template with transformers' own Jinja environment, which knows the `generation` tag of
    assistant masks: a bare Jinja environment cannot parse it and would read the template as taking strings."""
    assert detect_content_format(LOOPS_IN_GENERATION) == "openai"
    assert detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "string"
    assert detect_content_format("{% for m in messages %}{% for p in m.content | list %}{% endfor %}") == "string"
    macro = "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
    assert detect_content_format(macro + "{% for m in messages %}{{ show(m.content) }}{% endfor %}") == "openai"
    assert detect_content_format(macro + "{% for m in messages %}{{ show(m.role) }}{% endfor %}") == "string"


def test_a_template_with_the_generation_tag_gets_parts(
    sim_tokenizer_dir: Path, tmp_path: Path, hf_tokenizer: Any
) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(LOOPS_IN_GENERATION)
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, chat_template=template)
    with running_simulator(settings) as sim:
        counted = tokens(sim, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}])
    assert counted == len(hf_tokenizer("<Hello>Hi", add_special_tokens=False)["input_ids"])


def test_developer_messages_become_one_system_message_for_templates_that_never_name_the_role() -> None:
    developer = {"role": "developer", "content": [{"type": "text", "text": "d"}], "tools": None}
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": "u"},
        developer,
        {"role": "system", "content": "s"},
    ]
    assert for_template(conversation, "{{ messages }}") == [
        {"role": "system", "content": "d\n\ns"}, {"role": "user", "content": "u"}
    ]  # fmt: skip
    assert for_template(conversation, "{% if m.role == 'developer' %}{% endif %}") == conversation
    first: list[dict[str, Any]] = [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]
    assert for_template(first, "{{ messages }}") == [
        {"role": "system", "content": "d"},
        {"role": "user", "content": "u"},
    ]
