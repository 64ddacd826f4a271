"""The render answer the guard writes is, byte for byte, the one a real vLLM 0.32.0 wrote for the same request
(render_answers_0_32.json, recorded by render_answers_record.py), its random request ids compared by shape; the
differences of 0.31, 0.33 and 0.34 are cases read from their sources."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.policy.render_body import NOT_REPRODUCED, RenderKind, render_answer

FIXTURE = json.loads(pathlib.Path(__file__).with_name("render_answers_0_32.json").read_text())
ANSWERED = {name: case for name, case in FIXTURE["cases"].items() if case["status"] == 200}
REFUSED = {name: case for name, case in FIXTURE["cases"].items() if case["status"] != 200}
WINDOW = FIXTURE["max_model_len"]
HELLO = [0, 128803, 19923, 128804]  # the tiny model's chat prompt for one user turn "Hello"
RANDOM_ID = {
    "chat": r"chatcmpl-[0-9a-f]{16}",
    "messages": r"chatcmpl-[0-9a-f]{16}",
    "completion": r"cmpl-[0-9a-f]{16}",
    "responses": r"resp_[0-9a-f]{16}",
}


def answered(
    kind: RenderKind,
    body: dict[str, Any],
    release: tuple[int, int] | None,
    *,
    headers: dict[str, str] | None = None,
    prompts: list[list[int]] | None = None,
) -> Any:
    return json.loads(
        render_answer(kind, {"model": "tiny", **body}, headers or {}, prompts or [HELLO], WINDOW, release)
    )


def same_but_ids(ours: bytes, theirs: str, route: str) -> str:
    """`theirs` with each random request id replaced by ours in the same place, once its shape is vLLM's."""
    our_ids = re.findall(rb'"request_id":"([^"]*)"', ours)
    their_ids = re.findall(r'"request_id":"([^"]*)"', theirs)
    assert len(our_ids) == len(their_ids)
    for mine, real in zip(our_ids, their_ids, strict=True):
        if mine.decode() != real:
            shape = RANDOM_ID[route] + r"(-\d+)?"
            assert re.fullmatch(shape, real) and re.fullmatch(shape, mine.decode())
            theirs = theirs.replace(f'"request_id":"{real}"', f'"request_id":"{mine.decode()}"', 1)
    return theirs


@pytest.mark.parametrize("name", sorted(ANSWERED))
def test_the_answer_is_vllm_0_32s_byte_for_byte(name: str) -> None:
    case = ANSWERED[name]
    real = json.loads(case["answer"])
    prompts = [item["token_ids"] for item in real] if isinstance(real, list) else [real["token_ids"]]
    ours = render_answer(case["route"], case["body"], case["headers"], prompts, WINDOW, (0, 32))
    assert ours.decode() == same_but_ids(ours, case["answer"], case["route"])


def refused_prompts(case: dict[str, Any]) -> list[list[int]]:
    """The prompts of a refused request, which vLLM does not show: a token prompt as sent, "Hello"'s ids otherwise."""
    prompt = case["body"].get("prompt")
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return [prompt]
    return [HELLO] * (len(prompt) if isinstance(prompt, list) else 1)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_request_vllm_0_32_refuses_is_refused_with_its_message(name: str) -> None:
    case = REFUSED[name]
    error = json.loads(case["answer"])["error"]
    with pytest.raises(InvalidRequest) as refused:
        render_answer(case["route"], case["body"], case["headers"], refused_prompts(case), WINDOW, (0, 32))
    assert (refused.value.message, refused.value.param) == (error["message"], error["param"])


def test_fixture_covers_each_route_with_varied_requests() -> None:
    routes = [case["route"] for case in ANSWERED.values()]
    assert all(routes.count(route) >= 10 for route in ("chat", "completion", "messages", "responses"))
    assert FIXTURE["recorded"].startswith("vLLM 0.32.0 --enable-scale-out")


def test_random_request_ids_differ_between_answers() -> None:
    first, second = (answered("chat", {"messages": []}, (0, 32))["request_id"] for _ in range(2))
    assert first != second


# 0.31: no reasoning fields, no output_mode; ids always drawn anew; completions' beam search not refused.


def test_0_31_answers_without_the_fields_0_32_added() -> None:
    keys = list(answered("chat", {"messages": []}, (0, 31)))
    assert keys == [
        "request_id",
        "token_ids",
        "token_offsets",
        "features",
        "content_parts",
        "sampling_params",
        "model",
        "return_token_ids",
        "stream",
        "stream_options",
        "cache_salt",
        "priority",
        "kv_transfer_params",
        "ec_transfer_params",
    ]


def test_0_31_ignores_the_request_id_header_and_body() -> None:
    chat = answered("chat", {"messages": [], "request_id": "mine"}, (0, 31), headers={"X-Request-Id": "hdr"})
    assert re.fullmatch(RANDOM_ID["chat"], chat["request_id"])
    many = answered("completion", {"prompt": ["a", "b"], "request_id": "mine"}, (0, 31), prompts=[[1], [2]])
    ids = [item["request_id"] for item in many]
    assert all(re.fullmatch(RANDOM_ID["completion"], i) for i in ids) and ids[0] != ids[1]


def test_0_31_renders_completions_beam_search_and_0_32_refuses_it() -> None:
    assert answered("completion", {"prompt": "a", "use_beam_search": True}, (0, 31), prompts=[[1]])
    with pytest.raises(InvalidRequest, match="Beam search is not supported by the render endpoint"):
        answered("completion", {"prompt": "a", "use_beam_search": True}, (0, 32), prompts=[[1]])


def test_0_31_has_no_watermarking_nor_responses_min_p() -> None:
    body = {"input": "Hi", "min_p": 0.2, "watermarking": False}
    assert answered("responses", body, (0, 31))["sampling_params"]["min_p"] == 0.0
    assert "watermarking" not in answered("chat", {"messages": [], "watermarking": False}, (0, 31))["sampling_params"]
    assert (
        answered("chat", {"messages": [], "watermarking": False}, (0, 32))["sampling_params"]["watermarking"] is False
    )


# 0.33 and 0.34: parse_context, transfer params hoisted out of extra_args, return_token_ids passed on.


def test_0_33_chat_answer_carries_a_parse_context() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [{"id": "1"}, {"id": "2"}]}]
    chat = answered("chat", {"messages": messages, "chat_template_kwargs": {"x": 1}, "return_token_ids": True}, (0, 33))
    assert list(chat)[list(chat).index("output_mode") + 1] == "parse_context"
    assert chat["parse_context"] == {
        "tools": None,
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "include_reasoning": True,
        # the server's --cohere-format default first (vLLM 0.34 on the tiny model writes it so)
        "chat_template_kwargs": {
            "cohere_format": "cmd4",
            "x": 1,
            "add_generation_prompt": True,
            "continue_final_message": False,
        },
        "history_tool_call_cnt": 2,
    }
    assert chat["return_token_ids"] is True
    assert answered("completion", {"prompt": "a"}, (0, 33), prompts=[[1]])[0]["parse_context"] is None
    assert answered("responses", {"input": "a"}, (0, 33))["parse_context"] is None


def test_0_33_messages_parse_context_reads_the_anthropic_tool_choice() -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    context = answered("messages", body, (0, 33))["parse_context"]
    assert (context["tool_choice"], context["parallel_tool_calls"]) == ("required", False)
    assert answered("messages", {"messages": [], "max_tokens": 5}, (0, 33))["parse_context"]["tool_choice"] is None


@pytest.mark.parametrize("kind", ["chat", "completion", "messages"])
def test_0_33_hoists_transfer_params_out_of_extra_args(kind: RenderKind) -> None:
    body = {"messages": [], "prompt": "a", "max_tokens": 5, "kv_transfer_params": {"a": 1}, "vllm_xargs": {"k": "v"}}
    answer = answered(kind, body, (0, 33))
    answer = answer[0] if isinstance(answer, list) else answer
    assert answer["kv_transfer_params"] == {"a": 1} and answer["sampling_params"]["extra_args"] == {"k": "v"}
    older = answered(kind, body, (0, 32))
    older = older[0] if isinstance(older, list) else older
    assert older["kv_transfer_params"] is None
    assert older["sampling_params"]["extra_args"] == {"k": "v", "kv_transfer_params": {"a": 1}}


def test_0_33_responses_keeps_its_empty_extra_args_and_reads_spaces_between_special_tokens() -> None:
    """0.33's render moves the transfer params out of `extra_args` only when it holds any (an empty one returns
    early from `_hoist_transfer_params`, and msgspec writes `{}`, which is not the default None)."""
    params = answered("responses", {"input": "a", "spaces_between_special_tokens": False}, (0, 33))["sampling_params"]
    assert params["extra_args"] == {} and params["spaces_between_special_tokens"] is False
    kv = {"input": "a", "kv_transfer_params": {"do_remote_prefill": True}}
    answer = answered("responses", kv, (0, 33))
    assert "extra_args" not in answer["sampling_params"] and answer["kv_transfer_params"] == kv["kv_transfer_params"]
    assert (
        "spaces_between_special_tokens"
        not in answered("responses", {"input": "a", "spaces_between_special_tokens": False}, (0, 32))["sampling_params"]
    )


def test_0_34_reads_responses_thinking_budget_and_return_tokens_as_token_ids() -> None:
    body = {"input": "a", "thinking_token_budget": 64}
    assert answered("responses", body, (0, 34))["sampling_params"]["thinking_token_budget"] == 64
    assert "thinking_token_budget" not in answered("responses", body, (0, 33))["sampling_params"]
    chat = {"messages": [], "return_tokens_as_token_ids": True}
    assert answered("chat", chat, (0, 34))["parse_context"]["return_tokens_as_token_ids"] is True
    assert "return_tokens_as_token_ids" not in answered("chat", chat, (0, 33))["parse_context"]


def test_an_unknown_release_answers_as_the_newest() -> None:
    body = {"messages": [], "kv_transfer_params": {"a": 1}, "return_tokens_as_token_ids": True}
    assert answered("chat", body, None) == {**answered("chat", body, (0, 34)), "request_id": ANY_ID}


def test_what_is_not_reproduced_is_named_with_a_reason() -> None:
    names = [name for name, _ in NOT_REPRODUCED]
    assert "generation_config" in names and all(reason for _, reason in NOT_REPRODUCED)


class _AnyId:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and re.fullmatch(RANDOM_ID["chat"], other) is not None


ANY_ID = _AnyId()


def test_0_33_spells_floats_as_orjson_does() -> None:
    body = {"model": "tiny", "messages": [], "min_p": 1e-5, "top_p": 2.5e-7, "logit_bias": {"3": 1e-6}}
    older = render_answer("chat", body, {}, [HELLO], WINDOW, (0, 32)).decode()
    newer = render_answer("chat", body, {}, [HELLO], WINDOW, (0, 33)).decode()
    assert '"top_p":2.5e-07,"min_p":1e-05' in older and '"logit_bias":{"3":1e-06}' in older
    assert '"top_p":2.5e-7,"min_p":0.00001' in newer and '"logit_bias":{"3":1e-6}' in newer


def test_0_33_answer_is_what_orjson_writes_of_it() -> None:
    orjson = pytest.importorskip("orjson")
    for name, case in ANSWERED.items():
        real = json.loads(case["answer"])
        prompts = [item["token_ids"] for item in real] if isinstance(real, list) else [real["token_ids"]]
        body = {**case["body"], "min_p": 1.5e-5, "temperature": 0.5, "logit_bias": {"1": -3e-8}}
        ours = render_answer(case["route"], body, case["headers"], prompts, WINDOW, (0, 33))
        assert ours == orjson.dumps(json.loads(ours)), name


def test_a_prompt_over_the_window_is_refused_not_answered_with_a_negative_limit() -> None:
    with pytest.raises(InvalidRequest, match=r"Input length \(5\) exceeds model's maximum context length \(4\)\."):
        render_answer("chat", {"model": "tiny", "messages": []}, {}, [[1, 2, 3, 4, 5]], 4, (0, 32))


def test_messages_min_tokens_is_read_from_0_34_and_effort_reaches_the_template_kwargs() -> None:
    body = {"messages": [], "max_tokens": 10, "min_tokens": 3, "output_config": {"effort": "low"}}
    assert answered("messages", body, (0, 34))["sampling_params"]["min_tokens"] == 3
    assert "min_tokens" not in answered("messages", body, (0, 33))["sampling_params"]
    kwargs = answered("messages", body, (0, 33))["parse_context"]["chat_template_kwargs"]
    assert kwargs == {
        "cohere_format": "cmd4",
        "add_generation_prompt": True,
        "continue_final_message": False,
        "reasoning_effort": "low",
        "enable_thinking": True,
    }


def test_the_manual_lists_every_field_the_answer_does_not_reproduce() -> None:
    manual = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "llm-d.md").read_text()
    assert [name for name, _ in NOT_REPRODUCED if f"`{name}`" not in manual] == []


def test_the_servers_default_kwargs_lie_under_the_requests_and_a_harmony_model_gets_none() -> None:
    body = {"messages": [], "chat_template_kwargs": {"enable_thinking": True, "gone": None}}
    defaults = {"enable_thinking": False, "style": "terse"}
    answer = json.loads(render_answer("chat", body, {}, [[1, 2]], 100, (0, 34), defaults))
    assert answer["parse_context"]["chat_template_kwargs"] == {
        "enable_thinking": True, "style": "terse", "cohere_format": "cmd4", "add_generation_prompt": True,
        "continue_final_message": False,
    }  # fmt: skip
    harmony = json.loads(render_answer("chat", body, {}, [[1, 2]], 100, (0, 34), defaults, harmony=True))
    assert harmony["parse_context"]["chat_template_kwargs"] == {}
