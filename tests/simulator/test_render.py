"""The simulator's render routes (vLLM --enable-scale-out): the ids are what the generation route charges, the answer
has the keys real vLLM 0.32.0 writes (captured from it serving the tiny model), and the errors are vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401

HELLO = [{"role": "user", "content": "Hello"}]
# real vLLM 0.32.0's answer to {"model":"tiny","messages":[{"role":"user","content":"Hello"}]}, keys in order
KEYS_032 = ["request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params", "model",
            "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode", "stream", "stream_options",
            "cache_salt", "priority", "kv_transfer_params", "ec_transfer_params"]  # fmt: skip
SAMPLING_032 = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
                "top_p": 1.0, "min_p": 0.0, "stop": [], "stop_token_ids": [], "max_tokens": 2044, "output_kind": 2,
                "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False}  # fmt: skip
ROUTES = ("/v1/chat/completions/render", "/v1/completions/render", "/v1/messages/render", "/v1/responses/render")


@pytest.fixture(scope="module", name="sims")
def fixture_sims(sim_tokenizer_dir: Path) -> Iterator[dict[str, RunningSim]]:
    """0.31-0.34 with --enable-scale-out, and 0.31 / 0.32 without it ("off-0.31", "off-0.32")."""
    with (
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.31", enable_scale_out=True)) as v031,
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.32", enable_scale_out=True)) as v032,
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.33", enable_scale_out=True)) as v033,
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.34", enable_scale_out=True)) as v034,
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.31")) as off031,
        running_simulator(SimulatorSettings(sim_tokenizer_dir, profile="0.32")) as off032,
    ):
        yield {"0.31": v031, "0.32": v032, "0.33": v033, "0.34": v034, "off-0.31": off031, "off-0.32": off032}


def post(sim: RunningSim, path: str, body: dict[str, Any], status: int = 200, **headers: str) -> Any:
    response = sim.client.post(path, json=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("version", ["0.31", "0.32", "0.33", "0.34"])
def test_the_ids_are_what_generation_charges(sims: dict[str, RunningSim], version: str) -> None:
    sim = sims[version]
    cases = [
        ("/v1/chat/completions", {"model": "tiny", "messages": HELLO, "max_tokens": 7}),
        ("/v1/completions", {"model": "tiny", "prompt": ["Hello", "Hi there, you"], "max_tokens": 5}),
        ("/v1/messages", {"model": "tiny", "max_tokens": 9, "system": "Be brief", "messages": HELLO}),
        ("/v1/responses", {"model": "tiny", "input": "Hello", "instructions": "Be brief", "max_output_tokens": 6}),
    ]
    for path, body in cases:
        rendered = post(sim, f"{path}/render", body)
        usage = post(sim, path, body)["usage"]
        answers = rendered if isinstance(rendered, list) else [rendered]
        assert len(answers) == (2 if path == "/v1/completions" else 1)
        charged = (usage["prompt_tokens"], usage["completion_tokens"]) if "prompt_tokens" in usage else \
            (usage["input_tokens"], usage["output_tokens"])  # fmt: skip
        assert sum(len(a["token_ids"]) for a in answers) == charged[0], path
        # the simulator generates exactly max_tokens: the limit rendered is the one generation spends
        assert sum(a["sampling_params"]["max_tokens"] for a in answers) == charged[1], path


def test_the_answer_is_vllm_032s(sims: dict[str, RunningSim]) -> None:
    answer = post(sims["0.32"], "/v1/chat/completions/render", {"model": "tiny", "messages": HELLO})
    assert list(answer) == KEYS_032
    assert answer["sampling_params"] == SAMPLING_032 and list(answer["sampling_params"]) == list(SAMPLING_032)
    assert answer["request_id"].startswith("chatcmpl-") and answer["output_mode"] == "tokens"
    streamed = post(sims["0.32"], "/v1/chat/completions/render", {"messages": HELLO, "temperature": 0.5, "seed": 7,
                    "stop": "x", "n": 2, "logprobs": True, "top_logprobs": 2, "max_tokens": 10, "top_k": 5,
                    "stream": True, "stream_options": {"include_usage": True}, "cache_salt": "abc"})  # fmt: skip
    # real vLLM 0.32.0's sampling_params for the same request
    assert streamed["sampling_params"] == {"n": 2, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "repetition_penalty": 1.0, "temperature": 0.5, "top_p": 1.0, "top_k": 5, "min_p": 0.0, "seed": 7,
        "stop": ["x"], "stop_token_ids": [], "max_tokens": 10, "logprobs": 2, "output_kind": 1, "skip_clone": True,
        "bad_words": [], "skip_reading_prefix_cache": False}  # fmt: skip
    assert streamed["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert streamed["model"] is None and streamed["cache_salt"] == "abc"
    plain = post(sims["0.32"], "/v1/completions/render", {"prompt": "hi", "stream": True})
    assert plain[0]["stream"] is True and plain[0]["stream_options"] is None  # as 0.32.0: none sent, none written


def test_each_release_writes_its_keys(sims: dict[str, RunningSim]) -> None:
    body = {"model": "tiny", "messages": HELLO, "kv_transfer_params": {"remote": 1}}
    old = post(sims["0.31"], "/v1/chat/completions/render", body)
    assert "output_mode" not in old and "reasoning_ended" not in old
    assert old["sampling_params"]["extra_args"] == {"kv_transfer_params": {"remote": 1}}
    for version in ("0.33", "0.34"):  # the transfer params hoisted to the top level, a chat's parse context
        new = post(sims[version], "/v1/chat/completions/render", body)
        assert list(new) == [*KEYS_032[:11], "parse_context", *KEYS_032[11:]]
        assert new["kv_transfer_params"] == {"remote": 1} and "extra_args" not in new["sampling_params"]
        assert new["parse_context"]["tool_choice"] == "none"


def test_messages_min_tokens_from_034(sims: dict[str, RunningSim]) -> None:
    body = {"model": "tiny", "max_tokens": 9, "min_tokens": 3, "messages": HELLO}
    assert post(sims["0.34"], "/v1/messages/render", body)["sampling_params"]["min_tokens"] == 3
    assert "min_tokens" not in post(sims["0.33"], "/v1/messages/render", body)["sampling_params"]  # ignored there


def test_request_ids(sims: dict[str, RunningSim]) -> None:
    body = {"model": "tiny", "prompt": ["a", "b"], "request_id": "body"}
    assert [a["request_id"] for a in post(sims["0.32"], "/v1/completions/render", body, x_request_id="h")] == [
        "cmpl-h-0", "cmpl-h-1"]  # fmt: skip
    chat = post(sims["0.32"], "/v1/chat/completions/render", {"messages": HELLO, "request_id": "body"})
    assert chat["request_id"] == "chatcmpl-body"
    old = post(sims["0.31"], "/v1/chat/completions/render", {"messages": HELLO}, x_request_id="h")
    assert old["request_id"] != "chatcmpl-h"  # 0.31's are random
    assert (
        post(sims["0.32"], "/v1/responses/render", {"input": "x", "request_id": "resp_me"})["request_id"] == "resp_me"
    )


def test_errors(sims: dict[str, RunningSim]) -> None:
    sim = sims["0.32"]
    missing = post(sim, "/v1/messages/render", {"model": "nope", "max_tokens": 5, "messages": HELLO}, 404)
    assert missing["error"] == {"message": "The model `nope` does not exist. Valid aliases: tiny.",
                                "type": "NotFoundError", "param": "model", "code": 404}  # fmt: skip
    beam = {"message": "Beam search is not supported by the render endpoint", "type": "BadRequestError",
            "param": None, "code": 400}  # fmt: skip
    assert post(sim, "/v1/chat/completions/render", {"messages": HELLO, "use_beam_search": True}, 400)["error"] == beam
    assert post(sim, "/v1/completions/render", {"prompt": "hi", "use_beam_search": True}, 400)["error"] == beam
    post(sims["0.31"], "/v1/completions/render", {"prompt": "hi", "use_beam_search": True})  # 0.31 renders it
    stateless = post(sim, "/v1/responses/render", {"input": "Hi", "previous_response_id": "resp_1"}, 400)
    assert stateless["error"] == {
        "message": "previous_response_id is not supported by the stateless render endpoint.",
        "type": "invalid_request_error", "param": "previous_response_id", "code": 400,
    }  # fmt: skip
    # the renderer's own refusals, as real vLLM 0.32.0 words them
    long = post(sim, "/v1/completions/render", {"prompt": [5] * 2100}, 400)["error"]["message"]
    assert long.startswith("This model's maximum context length is 2048 tokens. However, your prompt contains 2100 "
                           "input tokens, which exceeds this limit even without any output tokens.")  # fmt: skip
    wide = post(sim, "/v1/messages/render", {"model": "tiny", "max_tokens": 5000, "messages": HELLO}, 400)["error"]
    assert wide["message"].startswith("max_completion_tokens=5000 cannot be greater than max_model_len=2048.")


def test_without_scale_out(sims: dict[str, RunningSim]) -> None:
    for path in ROUTES:
        refused = post(sims["off-0.32"], path, {}, 403)
        assert refused["error"] == {"message": "Scale-out endpoints are disabled. Restart vllm serve with "
                                    "--enable-scale-out to enable them.", "type": "PermissionDeniedError",
                                    "param": None, "code": 403}  # fmt: skip
    # 0.31 registers no route (POST /v1/responses/render meets GET /v1/responses/{response_id}: 405)
    assert [sims["off-0.31"].client.post(path, json={}).status_code for path in ROUTES] == [404, 404, 404, 405]
