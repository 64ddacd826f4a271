"""gpt-oss Responses turns counted as vLLM 0.31/0.32 render them, continued turns included: the guard's count of each
turn against an oracle that builds the harmony messages with openai_harmony the way vLLM's code does
(renderers/online_renderer.py _render_responses_with_harmony, responses/harmony.py, parser/harmony_utils.py, the
msg_store of responses/serving.py), parses the answer's tokens as vLLM's parser does and renders with
render_for_completion's rules. The guard sees only what a client sends and what vLLM answers (the output items)."""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import openai_harmony as oh
import pytest

from proxy.api.responses import parse_responses
from proxy.counting.local_count import count_chat
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import InvalidRequest
from proxy.policy.continued import continued_chat
from proxy.policy.ledger import Stored, Turn, recorded
from tests.support import zoo, zoo_models

ENC = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": CITY}
EFFORTS = {"low": oh.ReasoningEffort.LOW, "medium": oh.ReasoningEffort.MEDIUM, "high": oh.ReasoningEffort.HIGH}


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    directory = tmp_path_factory.mktemp("gpt-oss")
    shutil.copytree(zoo.family_dir("gpt-oss"), directory, dirs_exist_ok=True)
    (Path(directory) / "config.json").write_text(json.dumps(zoo_models.gpt_oss_config()))
    return load_tokenizer(str(directory))


# --- the oracle: vLLM's steps, from its source ------------------------------------------------------------------


def vllm_preamble(body: dict[str, Any]) -> list[oh.Message]:
    """build_harmony_preamble(instructions, tools if has_custom_tools, reasoning.effort), no tool server."""
    system = oh.SystemContent.new()
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        system = system.with_reasoning_effort(EFFORTS[effort])
    system = system.with_conversation_start_date(datetime.datetime.now().strftime("%Y-%m-%d"))
    messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    instructions, tools = body.get("instructions"), body.get("tools")
    if instructions or tools:
        developer = oh.DeveloperContent.new()
        if instructions is not None:
            developer = developer.with_instructions(instructions)
        functions = [oh.ToolDescription.new(t["name"], t.get("description") or "", t.get("parameters"))
                     for t in tools or [] if t["type"] == "function"]  # fmt: skip
        if functions:
            developer = developer.with_function_tools(functions)
        messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
    return messages


def vllm_input(item: dict[str, Any] | str, calls: list[dict[str, Any]]) -> oh.Message | None:
    """response_input_to_harmony (`calls`: the previous response's output, then this input's function calls)."""
    if isinstance(item, str):
        return oh.Message.from_role_and_content(oh.Role.USER, item)
    kind = item.get("type", "message")
    if kind == "message":
        content = item["content"]
        if isinstance(content, str):
            message = oh.Message.from_role_and_content(item["role"], content)
        else:
            message = oh.Message.from_role_and_contents(item["role"], [oh.TextContent(text=c.get("text", ""))
                                                                        for c in content])  # fmt: skip
        return message.with_channel("final") if item["role"] == "assistant" else message
    if kind == "function_call_output":
        call = next(c for c in reversed(calls) if c.get("type") == "function_call" and c["call_id"] == item["call_id"])
        author = oh.Author.new(oh.Role.TOOL, f"functions.{call['name']}")
        return oh.Message.from_author_and_content(author, item["output"]).with_channel("commentary") \
            .with_recipient("assistant")  # fmt: skip
    if kind == "reasoning":
        text = "\n".join(c["text"] for c in item.get("content") or [])
        return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("analysis") if text else None
    assert kind == "function_call"
    return oh.Message.from_role_and_content(oh.Role.ASSISTANT, item["arguments"]).with_channel("commentary") \
        .with_recipient(f"functions.{item['name']}").with_content_type("json")  # fmt: skip


def vllm_generated(text: str) -> list[oh.Message]:
    """The messages HarmonyContext appends from the model's tokens (the parser, flushed at the end)."""
    parser = oh.StreamableParser(ENC, role=oh.Role.ASSISTANT)
    for token in ENC.encode(text, allowed_special="all"):
        parser.process(token)
    parser.process_eos()
    return list(parser.messages)


def vllm_output(messages: list[oh.Message]) -> list[dict[str, Any]]:
    """harmony_to_response_output, as the JSON a client (and the guard) reads."""
    items: list[dict[str, Any]] = []
    for m in messages:
        texts = [c.text for c in m.content]
        if m.recipient is not None:
            rid = uuid.uuid4().hex
            items += [{"type": "function_call", "id": f"fc_{rid}", "call_id": f"call_{rid}", "status": "completed",
                       "name": m.recipient.removeprefix("functions."), "arguments": t} for t in texts]  # fmt: skip
        elif m.channel == "analysis":
            items += [{"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
                       "content": [{"type": "reasoning_text", "text": t}]} for t in texts]  # fmt: skip
        else:
            parts = [{"type": "output_text", "text": t, "annotations": [], "logprobs": None} for t in texts]
            items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "content": parts,
                          "status": "completed"})  # fmt: skip
    return items


def vllm_render(messages: list[oh.Message]) -> list[int]:
    """render_for_completion: analysis before the last final answer dropped, then the legacy tool-call headers."""
    finals = [i for i, m in enumerate(messages) if m.author.role == oh.Role.ASSISTANT and m.channel == "final"]
    last = finals[-1] if finals else -1
    kept = [m for i, m in enumerate(messages) if not (i < last and m.channel == "analysis")]
    ids = list(ENC.render_conversation_for_completion(oh.Conversation.from_messages(kept), oh.Role.ASSISTANT,
               config=oh.RenderConversationConfig(auto_drop_analysis=False)))  # fmt: skip
    return legacy_headers(ids)


def legacy_headers(ids: list[int]) -> list[int]:
    """_use_legacy_tool_call_headers: `assistant<|channel|>commentary to=x <|constrain|>json` headers rewritten as
    `assistant to=x<|channel|>commentary json`, token by token."""
    specials = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
    start, channel, constrain, message = (ENC.encode(t, allowed_special="all")[0] for t in specials)
    out, i = list(ids), 0
    while i < len(out):
        if out[i] != start:
            i += 1
            continue
        try:
            end = out.index(message, i + 1)
            at = out.index(channel, i + 1, end)
            kind_at = out.index(constrain, at + 1, end)
        except ValueError:
            i += 1
            continue
        author, header = ENC.decode(out[i + 1 : at]), ENC.decode(out[at + 1 : kind_at])
        kind = ENC.decode(out[kind_at + 1 : end])
        if author != "assistant" or " to=" not in header or not header.endswith(" "):
            i = end + 1
            continue
        name, recipient = header[:-1].split(" to=", 1)
        legacy = [start, *ENC.encode(f"assistant to={recipient}"), channel, *ENC.encode(f"{name} {kind}"), message]
        out[i : end + 1] = legacy
        i += len(legacy)
    return out


class Vllm:
    """One replica's msg_store and the output of each stored response."""

    def __init__(self) -> None:
        self.msg_store: dict[str, list[oh.Message]] = {}
        self.outputs: dict[str, list[dict[str, Any]]] = {}

    def turn(self, body: dict[str, Any], generated: str) -> tuple[int, str, list[dict[str, Any]]]:
        """The prompt's length, the response id and its output items."""
        previous = body.get("previous_response_id")
        items = body["input"] if isinstance(body["input"], list) else [body["input"]]
        messages = list(self.msg_store[previous]) if previous else vllm_preamble(body)
        calls = list(self.outputs[previous]) if previous else []
        for item in items:
            message = vllm_input(item, calls)
            if message is not None:
                messages.append(message)
            if isinstance(item, dict) and item.get("type") == "function_call":
                calls.append(item)
        prompt = len(vllm_render(messages))
        answer = vllm_generated(generated)
        rid = f"resp_{uuid.uuid4().hex}"
        self.msg_store[rid], self.outputs[rid] = messages + answer, vllm_output(answer)
        return prompt, rid, self.outputs[rid]


# --- the guard ---------------------------------------------------------------------------------------------------


class Guard:
    """What the guard does for each turn: count it with the entry it continues, record its answer's output."""

    def __init__(self, tok: ModelTokenizer) -> None:
        self.tok, self.entries, self.kept = tok, {}, 0  # type: ignore[var-annotated]

    def count(self, body: dict[str, Any]) -> tuple[int, Turn]:
        req = parse_responses(json.dumps({"model": "gpt-oss", **body}).encode())
        entry = self.entries.get(body.get("previous_response_id"))
        chat, messages = continued_chat(self.tok, req, True, entry)
        return asyncio.run(count_chat(self.tok, chat)), Turn("", "gpt-oss", messages, entry, True, True)

    def record(self, turn: Turn, rid: str, output: list[dict[str, Any]]) -> None:
        encoded = recorded(turn, rid, "http://replica", turn.messages, json.loads(json.dumps(output))).encode()
        self.kept = len(encoded)
        self.entries[rid] = Stored.decode(encoded)  # as another guard reads it from Redis


def converse(tok: ModelTokenizer, turns: list[tuple[dict[str, Any], str]]) -> list[tuple[int, int]]:
    """Each turn's count by vLLM and by the guard, each continuing the one before (when it names no other)."""
    vllm, guard, counts, last = Vllm(), Guard(tok), [], None
    for body, generated in turns:
        body = {"previous_response_id": last, **body} if last is not None else body
        counted, turn = guard.count(body)
        prompt, last, output = vllm.turn(body, generated)
        guard.record(turn, last, output)
        counts.append((prompt, counted))
    return counts


THOUGHT = "<|channel|>analysis<|message|>The user asks about {}. Think it through.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>{}<|return|>"
ANSWER = "<|channel|>final<|message|>{}<|return|>"  # an answer that is the model's first message
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{{"city": "{}"}}<|call|>')  # fmt: skip


def test_a_turn_with_reasoning_continued_two_and_three_turns_deep(gpt_oss: ModelTokenizer) -> None:
    turns: list[tuple[dict[str, Any], str]] = [
        ({"input": "What is a harmony?", "instructions": "Answer in one line.", "reasoning": {"effort": "low"}},
         THOUGHT.format("music") + FINAL.format("Notes sounding together.")),
        ({"input": "And a cadence?"}, THOUGHT.format("cadences") + FINAL.format("A closing progression.")),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Name one."}]}]},
         THOUGHT.format("examples") + FINAL.format("The perfect authentic cadence.")),
    ]  # fmt: skip
    counts = converse(gpt_oss, turns)
    assert [vllm for vllm, _ in counts] == [guard for _, guard in counts]
    assert counts[1][0] > counts[0][0] + 10 and counts[2][0] > counts[1][0] + 10  # the history really is counted


def test_a_tool_call_and_its_output_continued(gpt_oss: ModelTokenizer) -> None:
    """A turn that ends with a call and no final answer keeps its reasoning for the next turn, which sends the
    call's output; the new request's instructions, tools and effort are not rendered (no preamble is built)."""
    vllm, guard = Vllm(), Guard(gpt_oss)
    first = {"input": "Weather in Paris?", "tools": [WEATHER], "instructions": "Use tools."}
    counted, turn = guard.count(first)
    prompt, rid, output = vllm.turn(first, THOUGHT.format("weather") + CALL.format("Paris"))
    guard.record(turn, rid, output)
    assert counted == prompt and [item["type"] for item in output] == ["reasoning", "function_call"]
    result = {"type": "function_call_output", "call_id": output[1]["call_id"], "output": '{"c": 21}'}
    second = {"previous_response_id": rid, "instructions": "Something else entirely, which is not rendered.",
              "tools": [WEATHER], "reasoning": {"effort": "high"}, "input": [result]}  # fmt: skip
    counted, turn = guard.count(second)
    prompt, rid, _ = vllm.turn(second, THOUGHT.format("the result") + FINAL.format("21 degrees in Paris."))
    guard.record(turn, rid, vllm.outputs[rid])
    assert counted == prompt
    third = {"previous_response_id": rid, "input": "And in Rome?"}
    counted, _ = guard.count(third)
    assert counted == vllm.turn(third, ANSWER.format("Sunny."))[0]


def test_a_continued_turn_that_sends_a_call_and_its_output_itself(gpt_oss: ModelTokenizer) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    turns: list[tuple[dict[str, Any], str]] = [
        ({"input": "Hi", "tools": [WEATHER]}, ANSWER.format("Hello.")),
        ({"input": [{"role": "user", "content": "Weather in Oslo?"},
                    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask it."}]},
                    call, {"type": "function_call_output", "call_id": "c1", "output": "cold"}]},
         ANSWER.format("Cold.")),
    ]  # fmt: skip
    counts = converse(gpt_oss, turns)
    assert [vllm for vllm, _ in counts] == [guard for _, guard in counts]


def test_a_first_turn_with_a_leading_system_message_and_tools(gpt_oss: ModelTokenizer) -> None:
    asked = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    body = {"input": asked,
            "tools": [WEATHER, {"type": "web_search_preview"}], "reasoning": {"effort": "high"}}  # fmt: skip
    vllm_body = {**body, "instructions": "Be terse.", "input": asked[1:]}  # extract_instructions_from_messages
    counted, _ = Guard(gpt_oss).count(body)
    assert counted == Vllm().turn(vllm_body, ANSWER.format("Hi."))[0]


def test_an_output_for_a_call_the_previous_response_did_not_make_is_vllms_400(gpt_oss: ModelTokenizer) -> None:
    guard = Guard(gpt_oss)
    counted, turn = guard.count({"input": "Hi"})
    guard.record(turn, "resp_1", vllm_output(vllm_generated(ANSWER.format("Hello."))))
    with pytest.raises(InvalidRequest, match="No call message found for c9"):
        guard.count({"previous_response_id": "resp_1",
                     "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]})  # fmt: skip


def test_the_stored_history_keeps_no_analysis_before_its_last_final_answer(gpt_oss: ModelTokenizer) -> None:
    """What no later turn renders is not kept: the entry's size, which the ledger's bound counts, stays that of what
    is rendered."""
    guard, generated = Guard(gpt_oss), THOUGHT.format("x" * 2000) + FINAL.format("Short.")
    _, turn = guard.count({"input": "Hi"})
    guard.record(turn, "resp_1", vllm_output(vllm_generated(generated)))
    entry = guard.entries["resp_1"]
    assert entry is not None and entry.harmony is not None
    assert [m.get("channel") for m in entry.harmony.messages] == [None, None, "final"]  # system, user, answer
    assert guard.kept < 2000


def test_an_output_the_guard_cannot_rebuild_leaves_the_next_turn_partial(gpt_oss: ModelTokenizer) -> None:
    guard = Guard(gpt_oss)
    _, turn = guard.count({"input": "Hi"})
    guard.record(turn, "resp_1", [{"type": "web_search_call", "id": "ws_1", "status": "completed"}])
    entry = guard.entries["resp_1"]
    assert entry is not None and entry.harmony is None
    _, turn = guard.count({"previous_response_id": "resp_1", "input": "More"})
    assert turn.messages is None  # counted as partial: the new input only


@pytest.mark.parametrize(
    "item",
    [
        {"type": "reasoning", "summary": [], "content": ["not a part"]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": 7}]},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "x"}]},
    ],
)
def test_items_harmony_cannot_render_are_a_400_naming_the_input(gpt_oss: ModelTokenizer, item: dict[str, Any]) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    with pytest.raises(InvalidRequest) as refused:
        Guard(gpt_oss).count({"input": [{"role": "user", "content": "Hi"}, call, item]})
    assert refused.value.param == "input"
