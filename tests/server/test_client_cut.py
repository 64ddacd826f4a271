"""A chat or completions prompt over the window that asks vLLM to cut it (`truncate_prompt_tokens`) is served: the
guard counts what vLLM keeps, clamps the output on that count, and vLLM's usage agrees with it. With -1 and no output
limit, 0.32 refuses (it cuts to the whole window and leaves no output) where 0.33 cuts one token shorter and answers
one token; a cut vLLM refuses is refused in the OpenAI envelope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.prometheus import metric
from tests.support.servers import MODEL, guard, simulator

WINDOW = 256
LONG = "the quick brown fox jumps over the lazy dog " * 60  # well over the window


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def v032(deepseek_dir: Path) -> Iterator[str]:
    with (
        simulator(deepseek_dir, profile="0.32", max_model_len=WINDOW) as (sim, _, _),
        guard(sim.url, deepseek_dir) as g,
    ):
        yield g.url


@pytest.fixture(scope="module")
def v033(deepseek_dir: Path) -> Iterator[str]:
    with (
        simulator(deepseek_dir, profile="0.33", max_model_len=WINDOW) as (sim, _, _),
        guard(sim.url, deepseek_dir) as g,
    ):
        yield g.url


@pytest.fixture(scope="module")
def v031(deepseek_dir: Path) -> Iterator[str]:
    with (
        simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW) as (sim, _, _),
        guard(sim.url, deepseek_dir) as g,
    ):
        yield g.url


def chat(url: str, **extra: Any) -> Any:
    messages: Any = [{"role": "user", "content": LONG}]
    return sdk(url).chat.completions.with_raw_response.create(model=MODEL, messages=messages, extra_body=extra)


def mismatches(url: str) -> float:
    """The answers whose usage disagreed with the guard's count; there must have been answers to check."""
    text = httpx.get(f"{url}/metrics").text
    assert metric(text, "token_guard_count_checks_total", model=MODEL, source="local") > 0
    return metric(text, "token_guard_count_mismatches_total", model=MODEL, source="local")


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_a_chat_prompt_over_the_window_cut_by_vllm_is_served_on_the_kept_count(v032: str, side: str | None) -> None:
    raw = chat(v032, truncate_prompt_tokens=200, truncation_side=side, max_tokens=100)
    answer = raw.parse()
    assert answer.usage.prompt_tokens == 200 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp"  # 200 kept + 100 asked is past 256: clamped to 56
    assert int(raw.headers["x-token-guard-max-tokens"]) == WINDOW - 200
    assert answer.usage.completion_tokens <= WINDOW - 200
    assert mismatches(v032) == 0


def test_a_cut_that_fits_passes_unchanged(v032: str) -> None:
    raw = chat(v032, truncate_prompt_tokens=50, max_tokens=20)
    assert raw.parse().usage.prompt_tokens == 50 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert raw.headers["x-token-guard-action"] == "pass"


def test_completions_prompts_over_the_window_are_each_cut_and_served(v032: str) -> None:
    raw = sdk(v032).completions.with_raw_response.create(
        model=MODEL, prompt=[LONG, "short prompt"], max_tokens=30, extra_body={"truncate_prompt_tokens": 100}
    )
    answer = raw.parse()
    assert answer.usage is not None
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == 100  # the longest prompt, as vLLM keeps it
    assert raw.headers["x-token-guard-action"] == "pass"
    assert 100 < answer.usage.prompt_tokens < 110  # the long one cut to 100, the short one whole
    assert mismatches(v032) == 0  # the guard expected both, as kept


def test_minus_one_with_no_output_limit_is_refused_by_0_32(v032: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(v032, truncate_prompt_tokens=-1)
    assert refused.value.status_code == 400
    assert isinstance(refused.value.body, dict) and refused.value.body.get("code") == "context_length_exceeded"


def test_minus_one_with_no_output_limit_answers_one_token_on_0_33(v033: str) -> None:
    raw = chat(v033, truncate_prompt_tokens=-1)
    answer = raw.parse()
    assert answer.usage.prompt_tokens == WINDOW - 1 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert answer.usage.completion_tokens == 1
    assert mismatches(v033) == 0


def test_minus_one_with_an_output_limit_keeps_all_but_one_token(v032: str) -> None:
    raw = chat(v032, truncate_prompt_tokens=-1, max_tokens=50)
    answer = raw.parse()
    assert answer.usage.prompt_tokens == WINDOW - 1 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert answer.usage.completion_tokens == 1


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"truncate_prompt_tokens": WINDOW + 1}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 100.5}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 100, "truncation_side": "middle"}, "truncation_side"),
    ],
)
def test_a_cut_vllm_refuses_is_refused_in_the_openai_envelope(v032: str, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(v032, **extra)
    body = refused.value.body
    assert isinstance(body, dict) and body.get("param") == param and body.get("code") == 400


@pytest.mark.parametrize("limit", [None, 50])
def test_responses_truncation_auto_is_counted_as_vllm_keeps_it(v032: str, v033: str, limit: int | None) -> None:
    for url in (v032, v033):
        raw = sdk(url).responses.with_raw_response.create(
            model=MODEL, input=LONG, truncation="auto", max_output_tokens=limit
        )
        usage = raw.parse().usage
        assert usage is not None
        assert usage.input_tokens == WINDOW - 1 == int(raw.headers["x-token-guard-prompt-tokens"])
        assert usage.output_tokens == 1  # vLLM leaves the cut prompt one token of room
        assert mismatches(url) == 0


def checks(url: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, "token_guard_count_checks_total", model=MODEL, source="local")


def test_responses_truncation_auto_under_the_window_is_checked_whole(v032: str) -> None:
    before = checks(v032)
    raw = sdk(v032).responses.with_raw_response.create(model=MODEL, input="Hi there", truncation="auto")
    usage = raw.parse().usage
    assert usage is not None and usage.input_tokens == int(raw.headers["x-token-guard-prompt-tokens"])
    assert checks(v032) == before + 1  # its usage was compared with the guard's count
    assert mismatches(v032) == 0


def test_0_31_keeps_the_window_less_the_output_limit(v031: str) -> None:
    raw = chat(v031, truncate_prompt_tokens=-1, max_tokens=50)
    answer = raw.parse()
    assert answer.usage.prompt_tokens == WINDOW - 50 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert raw.headers["x-token-guard-action"] == "pass"
    assert mismatches(v031) == 0


def test_0_31_serves_a_cut_whose_limit_the_guard_lowered_to_fit(v031: str) -> None:
    raw = chat(v031, truncate_prompt_tokens=200, max_tokens=100)  # 0.31 alone refuses 200 > 256 - 100
    assert raw.parse().usage.prompt_tokens == 200 == int(raw.headers["x-token-guard-prompt-tokens"])
    assert int(raw.headers["x-token-guard-max-tokens"]) == WINDOW - 200
