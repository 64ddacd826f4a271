"""Records what a real vLLM answers on its render routes for the requests in CASES, into render_answers_0_32.json.

Run once against a vLLM started with --enable-scale-out serving the tiny model as `tiny` (max_model_len 2048):
`.venv/bin/python -m tests.policy.render_answers_record http://127.0.0.1:18932`. The tests read the file only."""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
from typing import Any

import httpx

FIXTURE = pathlib.Path(__file__).with_name("render_answers_0_32.json")
CHAT = [{"role": "user", "content": "Hello"}]
TWO_TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]

# name -> (route, headers, body)
CASES: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "chat plain": ("chat", {}, {"messages": CHAT}),
    "chat max_tokens": ("chat", {}, {"messages": TWO_TURNS, "max_tokens": 100}),
    "chat max_completion_tokens wins": ("chat", {}, {"messages": CHAT, "max_tokens": 70, "max_completion_tokens": 50}),
    "chat limit over the room is clamped": ("chat", {}, {"messages": CHAT, "max_completion_tokens": 2047}),
    "chat stream": ("chat", {}, {"messages": CHAT, "stream": True}),
    "chat stream_options": ("chat", {}, {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "chat greedy resets top_p top_k min_p": (
        "chat",
        {},
        {"messages": CHAT, "temperature": 0, "top_p": 0.5, "top_k": 5, "min_p": 0.1},
    ),
    "chat sampling": (
        "chat",
        {},
        {"messages": CHAT, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42},
    ),
    "chat tiny temperature is raised": ("chat", {}, {"messages": CHAT, "temperature": 0.001, "seed": -1}),
    "chat penalties": (
        "chat",
        {},
        {"messages": CHAT, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.1},
    ),
    "chat stops": ("chat", {}, {"messages": CHAT, "stop": ["END", "é!"], "stop_token_ids": [7, 3, 7]}),
    "chat stop string": ("chat", {}, {"messages": CHAT, "stop": "###", "include_stop_str_in_output": True}),
    "chat logprobs": ("chat", {}, {"messages": CHAT, "logprobs": True, "top_logprobs": 3, "n": 2}),
    "chat echo prompt logprobs": ("chat", {}, {"messages": CHAT, "echo": True, "top_logprobs": 2, "logprobs": True}),
    "chat token flags": (
        "chat",
        {},
        {
            "messages": CHAT,
            "ignore_eos": True,
            "min_tokens": 5,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "prompt_logprobs": 1,
        },
    ),
    "chat logit_bias and bad_words": (
        "chat",
        {},
        {"messages": CHAT, "logit_bias": {"10": 150, "20": -5.5}, "bad_words": ["no", "never", "no"]},
    ),
    "chat json_object": ("chat", {}, {"messages": CHAT, "response_format": {"type": "json_object"}}),
    "chat json_schema": (
        "chat",
        {},
        {
            "messages": CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": {"type": "object", "properties": {"color": {"type": "string"}}}},
            },
        },
    ),
    "chat header request id": ("chat", {"X-Request-Id": "abc-123"}, {"messages": CHAT, "request_id": "body-id"}),
    "chat body request id": ("chat", {}, {"messages": CHAT, "request_id": "body-id"}),
    "chat salt priority reasoning": (
        "chat",
        {},
        {"messages": CHAT, "cache_salt": "salty", "priority": 3, "include_reasoning": False},
    ),
    "chat transfer params": (
        "chat",
        {},
        {"messages": CHAT, "kv_transfer_params": {"do_remote_decode": True}, "vllm_xargs": {"k": "v"}},
    ),
    "completion plain": ("completion", {}, {"prompt": "Hello"}),
    "completion null max_tokens": ("completion", {}, {"prompt": "Hello", "max_tokens": None}),
    "completion list": ("completion", {}, {"prompt": ["Hello", "Once upon a time"], "max_tokens": 30}),
    "completion list header id": ("completion", {"X-Request-Id": "hdr"}, {"prompt": ["a", "b"], "max_tokens": 5}),
    "completion token prompt": ("completion", {}, {"prompt": [1, 2, 3, 4], "max_tokens": 2045}),
    "completion echo zero": ("completion", {}, {"prompt": "Hello", "echo": True, "max_tokens": 0, "logprobs": 2}),
    "completion echo logprobs": ("completion", {}, {"prompt": "Hello", "echo": True, "logprobs": 1}),
    "completion stream": (
        "completion",
        {},
        {"prompt": "Hello", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    ),
    "completion sampling": (
        "completion",
        {},
        {
            "prompt": "Hello",
            "temperature": 1.5,
            "top_p": 0.8,
            "top_k": -1,
            "seed": 7,
            "n": 3,
            "frequency_penalty": 1.0,
            "stop": ["\n"],
            "min_tokens": 2,
            "ignore_eos": True,
        },
    ),
    "completion json_object": ("completion", {}, {"prompt": "Hello", "response_format": {"type": "json_object"}}),
    "completion logit_bias": ("completion", {}, {"prompt": "Hello", "logit_bias": {"5": -200}, "bad_words": ["x"]}),
    "completion salt": ("completion", {}, {"prompt": "Hello", "cache_salt": "s", "priority": -1}),
    "completion body id": ("completion", {}, {"prompt": "Hello", "request_id": "mine"}),
    "completion transfer": ("completion", {}, {"prompt": "Hello", "ec_transfer_params": {"x": 1}}),
    "responses plain": ("responses", {}, {"input": "Hello"}),
    "responses max_output_tokens": ("responses", {}, {"input": "Hello", "max_output_tokens": 64}),
    "responses instructions": (
        "responses",
        {},
        {"input": [{"role": "user", "content": "Hi"}], "instructions": "Be kind."},
    ),
    "responses sampling": (
        "responses",
        {},
        {
            "input": "Hello",
            "temperature": 0.2,
            "top_p": 0.3,
            "top_k": 9,
            "min_p": 0.2,
            "seed": 11,
            "presence_penalty": 1,
            "repetition_penalty": 1.3,
        },
    ),
    "responses stop": (
        "responses",
        {},
        {
            "input": "Hello",
            "stop": "x",
            "stop_token_ids": [9, 9],
            "ignore_eos": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        },
    ),
    "responses logprobs": (
        "responses",
        {},
        {"input": "Hello", "include": ["message.output_text.logprobs"], "top_logprobs": 4},
    ),
    "responses top_logprobs alone": ("responses", {}, {"input": "Hello", "top_logprobs": 4}),
    "responses stream": ("responses", {}, {"input": "Hello", "stream": True}),
    "responses json_object": ("responses", {}, {"input": "Hello", "text": {"format": {"type": "json_object"}}}),
    "responses json_schema": (
        "responses",
        {},
        {"input": "Hello", "text": {"format": {"type": "json_schema", "name": "c", "schema": {"type": "object"}}}},
    ),
    "responses ids": ("responses", {"X-Request-Id": "ignored"}, {"input": "Hello", "request_id": "resp_mine"}),
    "responses transfer": (
        "responses",
        {},
        {"input": "Hello", "kv_transfer_params": {"a": 1}, "vllm_xargs": {"z": 2}, "cache_salt": "q", "priority": 2},
    ),
    "responses logit_bias": ("responses", {}, {"input": "Hello", "logit_bias": {"3": 0.5}}),
    "responses truncation auto": ("responses", {}, {"input": "Hello", "truncation": "auto", "max_output_tokens": 2046}),
    "messages plain": ("messages", {}, {"messages": CHAT, "max_tokens": 10}),
    "messages system": ("messages", {}, {"system": "Be brief.", "messages": CHAT, "max_tokens": 2046}),
    "messages stream": ("messages", {}, {"messages": CHAT, "max_tokens": 10, "stream": True}),
    "messages sampling": (
        "messages",
        {},
        {"messages": CHAT, "max_tokens": 10, "temperature": 0.5, "top_p": 0.7, "top_k": 3, "stop_sequences": ["STOP"]},
    ),
    "messages greedy": ("messages", {}, {"messages": CHAT, "max_tokens": 10, "temperature": 0.0}),
    "messages header id": ("messages", {"X-Request-Id": "m-1"}, {"messages": CHAT, "max_tokens": 10}),
    "messages thinking": (
        "messages",
        {},
        {"messages": CHAT, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    ),
    "messages metadata": ("messages", {}, {"messages": CHAT, "max_tokens": 10, "metadata": {"user_id": "u"}}),
    "messages transfer": (
        "messages",
        {},
        {"messages": CHAT, "max_tokens": 10, "kv_transfer_params": {"a": 1}, "cache_salt": "salt"},
    ),
    "messages two turns": (
        "messages",
        {},
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
            ],
            "max_tokens": 1,
        },
    ),
    "chat engine fields": (
        "chat",
        {},
        {"messages": CHAT, "allowed_token_ids": [1, 2], "stream_interval": 3, "routed_experts_prompt_start": 2},
    ),
    "chat structured_outputs regex": ("chat", {}, {"messages": CHAT, "structured_outputs": {"regex": "a+"}}),
    "chat thinking budget": ("chat", {}, {"messages": CHAT, "thinking_token_budget": 50, "watermarking": True}),
    "chat logprobs without top_logprobs": ("chat", {}, {"messages": CHAT, "logprobs": True, "temperature": 1e-6}),
    "completion explicit 16 is omitted": ("completion", {}, {"prompt": "Hi", "max_tokens": 16, "logprobs": 0}),
    "messages output_config": (
        "messages",
        {},
        {
            "messages": CHAT,
            "max_tokens": 10,
            "min_tokens": 3,
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
        },
    ),
    "refused chat min_tokens over max_tokens": ("chat", {}, {"messages": CHAT, "max_tokens": 10, "min_tokens": 11}),
    "refused chat zero max_tokens": ("chat", {}, {"messages": CHAT, "max_tokens": 0}),
    "refused completion zero max_tokens": ("completion", {}, {"prompt": ["Hi", "a"], "max_tokens": 0}),
    "refused completion prompt filling the window": ("completion", {}, {"prompt": [5] * 2048}),
    "refused chat beam search": ("chat", {}, {"messages": CHAT, "use_beam_search": True, "n": 2}),
    "refused chat limit over the window": ("chat", {}, {"messages": CHAT, "max_tokens": 5000}),
    "refused chat completion limit over the window": ("chat", {}, {"messages": CHAT, "max_completion_tokens": 2049}),
    "refused completion beam search": ("completion", {}, {"prompt": "Hello", "use_beam_search": True}),
    "refused completion limit over the window": ("completion", {}, {"prompt": ["a", "b"], "max_tokens": 3000}),
    "refused responses previous_response_id": ("responses", {}, {"input": "Hi", "previous_response_id": "resp_1"}),
    "refused responses limit over the window": ("responses", {}, {"input": "Hi", "max_output_tokens": 2049}),
    "refused messages limit over the window": ("messages", {}, {"messages": CHAT, "max_tokens": 4096}),
}
PATHS = {
    "chat": "/v1/chat/completions/render",
    "completion": "/v1/completions/render",
    "messages": "/v1/messages/render",
    "responses": "/v1/responses/render",
}


def record(base: str) -> dict[str, Any]:
    cases = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        version = client.get("/version").json()["version"]
        for name, (route, headers, body) in CASES.items():
            sent = {"model": "tiny", **body}
            reply = client.post(PATHS[route], json=sent, headers=headers)
            cases[name] = {
                "route": route,
                "headers": headers,
                "body": sent,
                "status": reply.status_code,
                "answer": reply.text,
            }
    today = datetime.date.today().isoformat()
    return {
        "recorded": f"vLLM {version} --enable-scale-out, the tiny model served as tiny (max_model_len 2048), "
        f"{today}, by tests/policy/render_answers_record.py",
        "max_model_len": 2048,
        "cases": cases,
    }


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record(sys.argv[1]), indent=1, ensure_ascii=False) + "\n")
